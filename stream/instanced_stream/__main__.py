from instanced_stream.cli.entry import main

raise SystemExit(main())
