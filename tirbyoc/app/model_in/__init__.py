"""How a model comes in: the frontends (`builtin:`, ONNX, Python files, PyTorch export) and
their loaders, the built-in model zoo, the inputs drawn in each input's domain, the named
sizes of a dynamic model, and `legalize.legalized_model`, the one path every command takes
from a model to the legalized module the templates offload. Imports no other room."""
