"""``neuron-lab run``: execute a notebook or script headless with the extension loaded, report, gate, export."""
