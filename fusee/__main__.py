"""`python -m fusee ...`: the same as the `fusee` command."""

from fusee._cli import main

raise SystemExit(main())
