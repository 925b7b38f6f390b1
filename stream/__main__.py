from stream.ops.cli import main

raise SystemExit(main())
