"""The static buffer arena: capacities, declarations, one allocation, frozen views.

Memory only: nothing here imports the kernels, the staging, the builders or the graphs.
"""

from staticattn.arena.arena import ALIGNMENT, Arena
from staticattn.arena.buffers import BufferDecl
from staticattn.arena.config import ArenaConfig, cdiv, round_up
from staticattn.arena.groups import CacheGroup, cache_groups

__all__ = ["ALIGNMENT", "Arena", "ArenaConfig", "BufferDecl", "CacheGroup", "cache_groups",
           "cdiv", "round_up"]
