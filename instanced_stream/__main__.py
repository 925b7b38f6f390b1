from instanced_stream.ops.cli import main

raise SystemExit(main())
