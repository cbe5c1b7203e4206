from lockstep.bytecode import own_bytecode_cache

own_bytecode_cache()  # before the CLI's own imports (bytecode.py); main() asks again for the console script

from lockstep.cli import main  # noqa: E402

raise SystemExit(main())
