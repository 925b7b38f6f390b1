from instanced_stream.cli.main import main

raise SystemExit(main())
