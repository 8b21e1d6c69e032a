"""What libstagehand sees of a PyTorch program's memory, in each allocator mode.

PyTorch asks for memory per tensor (a storage of N bytes); what reaches the
library depends on PyTorch's allocator:

- preload: the native caching allocator. It cudaMallocs *segments* (2 MiB
  for requests up to 1 MiB, 20 MiB up to 10 MiB, larger requests rounded up
  to 2 MiB), splits them into blocks and reuses freed blocks itself; it
  never gives a segment back in a training loop. The library sees only the
  segments: a region per segment, allocated once, never freed.
- async: PyTorch's cudaMallocAsync backend: one cudaMallocAsync per tensor
  and a cudaFreeAsync when it dies. The library makes a region of each
  allocation above [regions] suballoc_max_kb (1 MiB); smaller ones come from
  its sub-allocator, are never evicted and are not in a trace.
- pluggable: stagehand.enable("pluggable", mempool=False), PyTorch's
  CUDAPluggableAllocator as the current allocator: the same per-tensor
  calls, through stagehand_malloc/stagehand_free. (With a MemPool, the
  default where PyTorch has one, the caching allocator stays on top and the
  library sees segments, as in preload mode.)

Region ids are device addresses, as in the library's own traces. The
library reuses a freed region for the next allocation of the same mapped
size (its size rounded up to the 2 MiB granularity), most recently freed
first, while the freed regions fit in [regions] device_cache_mb (1 GiB):
ids="reuse" gives ids that come back the same way; ids="unique" (the
default) gives every region an address of its own. Regions torn down to
stay within the cache do not give their addresses back here.

Every model reports regions to a sink: sink.region_alloc(id, bytes) and
sink.region_free(id).
"""

import bisect

MODES = ("preload", "async", "pluggable")
ID_MODES = ("unique", "reuse")

MIB = 1 << 20
GRANULARITY = 2 * MIB           # the VMM granularity of current GPUs
BASE_VA = 0x7F0000000000         # where the made-up addresses start

# PyTorch's CUDACachingAllocator constants (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK = 512                  # every block is a multiple of this
SMALL_SIZE = 1 * MIB             # largest request served by the small pool
SMALL_BUFFER = 2 * MIB           # a small-pool segment
LARGE_BUFFER = 20 * MIB          # a segment for requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB            # larger segments are rounded up to this

# libstagehand's defaults (stagehand.ini).
MIN_REGION = 1 * MIB             # [regions] min_region_kb: smaller cudaMallocs pass through
SUBALLOC_MAX = 1 * MIB           # [regions] suballoc_max_kb
DEVICE_CACHE = 1024 * MIB        # [regions] device_cache_mb


def round_up(n, m):
    return (n + m - 1) // m * m


class _AddressSpace:
    """Made-up device addresses, 2 MiB aligned, never handed out twice."""

    def __init__(self):
        self.next = BASE_VA

    def take(self, nbytes):
        va = self.next
        self.next += round_up(max(nbytes, 1), GRANULARITY)
        return va


class Block:
    """A piece of memory PyTorch handed to one storage; `region` is the
    library's region it lies in, or None when the library does not manage it."""

    __slots__ = ("ptr", "size", "region", "allocated", "prev", "next", "pool")

    def __init__(self, ptr, size, region, pool=None):
        self.ptr, self.size, self.region, self.pool = ptr, size, region, pool
        self.allocated = True
        self.prev = self.next = None


class CachingAllocator:
    """PyTorch's native caching allocator, as the preloaded library sees it.

    Modelled: request rounding, the small and large pools, best-fit reuse
    of free blocks (smallest that fits, then lowest address), splitting a
    block when the rest is worth keeping (small pool: at least 512 bytes;
    large: more than 1 MiB), merging a freed block with free neighbours, and
    segment sizes. Not modelled: several streams (one here), max_split_size
    and roundup_power2_divisions (off by default), expandable segments (the
    library manages none of that memory), and releasing cached segments on
    out-of-memory or empty_cache() (with the library a cudaMalloc does not
    fail for want of room).
    """

    mode = "preload"

    def __init__(self, sink, min_region=MIN_REGION):
        self.sink = sink
        self.min_region = min_region
        self.space = _AddressSpace()
        self.pools = {True: [], False: []}  # small?: sorted [(size, ptr, block)]
        self.segments = []                  # (base, size) of every segment, in order

    @staticmethod
    def round_size(n):
        return MIN_BLOCK if n < MIN_BLOCK else round_up(n, MIN_BLOCK)

    @staticmethod
    def segment_size(size):
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return round_up(size, ROUND_LARGE)

    def _insert(self, b):
        bisect.insort(self.pools[b.pool], (b.size, b.ptr, b))

    def _remove(self, b):
        pool = self.pools[b.pool]
        i = bisect.bisect_left(pool, (b.size, b.ptr))
        assert pool[i][2] is b, "free block missing from its pool"
        del pool[i]

    def alloc(self, nbytes):
        size = self.round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            seg = self.segment_size(size)
            base = self.space.take(seg)
            self.segments.append((base, seg))
            region = base if seg >= self.min_region else None
            if region is not None:
                self.sink.region_alloc(region, seg)
            block = Block(base, seg, region, small)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = Block(block.ptr + size, rest, block.region, small)
            tail.allocated = False
            tail.prev, tail.next = block, block.next
            if block.next:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.allocated = True
        return block

    def free(self, block):
        assert block.allocated, "block freed twice"
        block.allocated = False
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                self._remove(other)
                if other is block.prev:
                    block.ptr = other.ptr
                    block.prev = other.prev
                    if other.prev:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next:
                        other.next.prev = block
                block.size += other.size
        self._insert(block)

    def finish(self):
        """Nothing: PyTorch keeps its segments until the process ends."""


class PerTensorAllocator:
    """The cudaMallocAsync backend and the pluggable allocator: every tensor
    is an allocation the library sees; those above suballoc_max are regions."""

    def __init__(self, sink, mode="async", ids="unique", suballoc_max=SUBALLOC_MAX,
                 device_cache=DEVICE_CACHE):
        if mode not in ("async", "pluggable"):
            raise ValueError("per-tensor mode %r: async or pluggable" % mode)
        if ids not in ID_MODES:
            raise ValueError("ids=%r: one of %s" % (ids, ", ".join(ID_MODES)))
        self.mode, self.sink, self.ids = mode, sink, ids
        self.suballoc_max, self.device_cache = suballoc_max, device_cache
        self.space = _AddressSpace()
        self.freed = {}       # mapped size -> [va], most recently freed last
        self.freed_order = [] # (va, mapped), oldest first
        self.freed_bytes = 0

    def alloc(self, nbytes):
        if nbytes <= self.suballoc_max:
            return Block(0, nbytes, None)
        mapped = round_up(nbytes, GRANULARITY)
        stack = self.freed.get(mapped)
        if stack:
            va = stack.pop()
            self.freed_order.remove((va, mapped))
            self.freed_bytes -= mapped
        else:
            va = self.space.take(mapped)
        self.sink.region_alloc(va, nbytes)
        return Block(va, nbytes, va)

    def free(self, block):
        if block.region is None:
            return
        self.sink.region_free(block.region)
        if self.ids != "reuse":
            return
        mapped = round_up(block.size, GRANULARITY)
        self.freed.setdefault(mapped, []).append(block.region)
        self.freed_order.append((block.region, mapped))
        self.freed_bytes += mapped
        while self.freed_bytes > self.device_cache:  # the oldest are torn down
            va, size = self.freed_order.pop(0)
            self.freed[size].remove(va)
            self.freed_bytes -= size

    def finish(self):
        pass


def make(mode, sink, ids="unique"):
    """The allocator model of a mode (MODES)."""
    if mode == "preload":
        if ids != "unique":
            raise ValueError("ids=%r: segments are never freed in preload mode, so their "
                             "ids are never reused; use ids='unique'" % ids)
        return CachingAllocator(sink)
    if mode in ("async", "pluggable"):
        return PerTensorAllocator(sink, mode, ids)
    raise ValueError("unknown allocator mode %r: one of %s" % (mode, ", ".join(MODES)))
