"""attnspec in PyTorch: a fast, device-agnostic implementation of the spec.

``attention`` is the functional core over tensors; ``MultiHeadAttention`` an
``nn.Module`` owning the parameters; ``from_torch_mha`` / ``to_torch_mha``
convert to and from ``torch.nn.MultiheadAttention``.
"""

from .functional import attention
from .interop import from_torch_mha, to_torch_mha
from .module import MultiHeadAttention

__all__ = ["attention", "MultiHeadAttention", "from_torch_mha", "to_torch_mha"]
