"""What TorchNeuron's dynamo backend says when a compiled graph fails: its logger and its lines.

tnx ``neuron_dynamo_backend/backend.py:236-242`` (98154b8): a graph whose NEFF setup fails raises
:data:`SETUP_FAILED`, or, with ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0``, logs :data:`EXECUTION_FAILED` and
:data:`EAGER_MESSAGE` and runs the graph eagerly. The emulator says them as TorchNeuron does and the TorchNeuron
adapter reads them back, so the workbench reports such a graph alike on both: one home for the words of both.
"""

LOGGER = "torch_neuronx.neuron_dynamo_backend"
SETUP_FAILED = "Neuron backend NEFF execution setup failed with unexpected error: "
EXECUTION_FAILED = "Execution failed: "
EAGER_MESSAGE = "Falling back to original GraphModule execution"
