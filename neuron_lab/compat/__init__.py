"""The private names of neuron_lab's dependencies, one module per dependency, each name read in one function.

A function's docstring says which versions of its dependency have the name and what happens when it is
missing; ``tests/test_compat.py`` checks every function against the installed versions, so a release that
renames one fails there, by name. Nothing here imports neuron_lab: any layer may use it.
"""
