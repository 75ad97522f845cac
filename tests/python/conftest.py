"""Every compile in the suite compiles: no cached Inductor graph from an earlier run.

Inductor's on-disk graph caches (in /tmp, shared by every checkout on a
machine) key on the traced graph, not on an operator's fake implementation,
so after a fake is fixed a cached graph still carries the old output dtype,
and a broken fake hides behind a graph cached while it was right.
"""

import torch._functorch.config
import torch._inductor.config

torch._inductor.config.fx_graph_cache = False
torch._functorch.config.enable_autograd_cache = False
