from neuron_lab.cli import main

raise SystemExit(main())
