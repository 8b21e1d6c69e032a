"""Op accounting: which PyTorch ops launch kernels, what they cost, and how to
run them on the meta device when PyTorch cannot.

Every op the dispatch mode sees is one of:

- a view (its outputs alias an input: view, t, expand, detach...): no kernel;
- an allocation only (empty, empty_like, new_empty...): memory, no kernel;
- a kernel: one launch, or for the multi-tensor ops (_foreach_*, _fused_*)
  as many launches as PyTorch's multi_tensor_apply makes (at most 110, 64,
  48, 36 or 30 tensors for 1 to 5 tensor lists, at most 320 blocks of
  65536 elements each).

A kernel's cost is its FLOPs and the bytes it moves. FLOPs are counted for
the ops that are compute bound (matmuls, convolutions, attention); every
other op is charged one FLOP per output element, and the roofline makes it
memory bound. Bytes are the sizes of its tensor arguments and results (a
view's own elements, not its whole storage), read or written once each,
except for gathers (embedding, index_select, gather), which read only the
rows they return.
"""

import math

import torch
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# Ops that make memory but run no kernel. (zeros, ones, full and friends fill
# what they allocate: kernels.)
_ALLOC_ONLY = frozenset((
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
    "resize_", "resize_as_", "set_", "lift_fresh", "_pin_memory",
))
# Ops that neither allocate nor run a kernel: metadata queries.
_NO_KERNEL = frozenset((
    "_has_compatible_shallow_copy_type", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "size", "stride", "dim", "is_contiguous",
    "_version", "record_stream",
))
# Views whose schema does not say so.
_UNMARKED_VIEWS = frozenset(("_unsafe_view",))
_GATHERS = frozenset(("embedding", "index_select", "gather", "take"))

# multi_tensor_apply's limits (aten/src/ATen/native/cuda/MultiTensorApply.cuh).
_MAX_TENSORS = (110, 64, 48, 36, 30)
_MAX_BLOCKS = 320
_CHUNK = 65536


def name(func):
    """The op's base name: aten.add_.Tensor -> "add_"."""
    return func.overloadpacket.__name__


def kind(func):
    """'view', 'alloc', 'none' (metadata only) or 'kernel'."""
    n = name(func)
    if n in _ALLOC_ONLY:
        return "alloc"
    if n in _NO_KERNEL:
        return "none"
    if n in _UNMARKED_VIEWS:
        return "view"
    s = func._schema
    if not s.is_mutable and any(r.alias_info is not None for r in s.returns):
        return "view"
    return "kernel"


def tensors(tree):
    """The tensors in args/kwargs/results, in order."""
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def nbytes(t):
    return t.numel() * t.element_size()


_RATE = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16",
         torch.bfloat16: "bf16"}


def _prod(xs):
    return math.prod(int(x) for x in xs)


def _conv_flops(x_shape, w_shape, out_shape, transposed):
    """2 x multiply-adds of a convolution: every output element of a
    non-transposed one is a dot product of Cin/groups x kernel elements."""
    k = _prod(w_shape[2:])
    if transposed:  # weight is (Cin, Cout/groups, k...): each input element scatters
        return 2 * _prod(x_shape) * w_shape[1] * k
    return 2 * _prod(out_shape) * w_shape[1] * k


def _sdpa_flops(q, k):
    """Two matmuls of (B, H, Lq, D) x (B, H, D, Lk)."""
    *batch, lq, d = q.shape
    return 4 * _prod(batch) * lq * k.shape[-2] * d


def flops_and_rate(func, args, out, tf32_matmul=False):
    """(FLOPs, the dtype whose peak applies) of a kernel."""
    n = name(func)
    ins = tensors(args)
    dtype = next((t.dtype for t in ins if t.is_floating_point()), torch.float32)
    rate = _RATE.get(dtype, "fp32")
    if n in ("mm", "addmm", "bmm", "baddbmm", "addbmm"):
        a, b = (args[0], args[1]) if n in ("mm", "bmm") else (args[1], args[2])
        flops = 2 * _prod(a.shape) * b.shape[-1]
        if rate == "fp32" and tf32_matmul:
            rate = "tf32"
        return flops, rate
    if n in ("convolution", "_convolution", "convolution_backward"):
        if rate == "fp32":  # cuDNN runs FP32 convolutions on TF32 by default
            rate = "tf32"
        if n == "convolution_backward":
            grad, x, w = args[0], args[1], args[2]
            transposed, mask = args[7], args[10]
            once = _conv_flops(x.shape, w.shape, grad.shape, transposed)
            return once * (int(mask[0]) + int(mask[1])), rate
        x, w, transposed = args[0], args[1], args[6]
        return _conv_flops(x.shape, w.shape, tensors(out)[0].shape, transposed), rate
    if n.startswith("_scaled_dot_product") or n.startswith("_flash_attention") or \
            n.startswith("_efficient_attention"):
        if "backward" in n:  # recompute the scores, then four matmuls for dQ, dK, dV
            return 2.5 * _sdpa_flops(args[1], args[2]), rate
        return _sdpa_flops(args[0], args[1]), rate
    outs = tensors(out)
    return max([t.numel() for t in outs] + [1]), "fp32"


def bytes_moved(func, args, out):
    """Bytes a kernel reads and writes."""
    outs = tensors(out)
    if name(func) in _GATHERS:
        idx = [t for t in tensors(args) if not t.is_floating_point()]
        return 2 * sum(nbytes(t) for t in outs) + sum(nbytes(t) for t in idx)
    return sum(nbytes(t) for t in tensors(args)) + sum(nbytes(t) for t in outs)


def written(func, args, kwargs, out):
    """The tensors a kernel writes: its results, and the arguments its schema
    marks as written (Tensor(a!): in-place and out= ops, _foreach_*_ lists)."""
    ws = tensors(out)
    kwargs = kwargs or {}
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        ws += tensors(v)
    return ws


def is_multi_tensor(func):
    n = name(func)
    return (n.startswith("_foreach_") or n.startswith("_fused_")) and any(
        isinstance(a.type, torch.ListType) and "Tensor" in str(a.type.getElementType())
        for a in func._schema.arguments)


def multi_tensor_launches(args, out):
    """How multi_tensor_apply cuts a multi-tensor op into launches: a list of
    (element share, [tensor positions]) per launch. Tensor position i stands
    for the i-th tensor of every list."""
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and
             all(isinstance(t, torch.Tensor) for t in a)]
    if isinstance(out, (list, tuple)) and out and all(isinstance(t, torch.Tensor) for t in out):
        lists.append(out)
    if not lists:
        return []
    first = lists[0]
    depth = min(len(lists), len(_MAX_TENSORS))
    max_tensors = _MAX_TENSORS[depth - 1]
    total = sum(t.numel() for t in first) or 1
    launches, cur, blocks, elems = [], [], 0, 0
    for i, t in enumerate(first):
        n = t.numel()
        chunks = max(1, -(-n // _CHUNK))
        for c in range(chunks):
            if not cur or cur[-1] != i:
                cur.append(i)
            blocks += 1
            elems += min(_CHUNK, n - c * _CHUNK) if n else 0
            if blocks == _MAX_BLOCKS or (len(cur) == max_tensors and c == chunks - 1):
                launches.append((elems / total, cur))
                cur, blocks, elems = [], 0, 0
    if cur:
        launches.append((elems / total, cur))
    return launches


# ---- running ops on the meta device ------------------------------------------

class MetaUnsupported(RuntimeError):
    """An op PyTorch cannot run on the meta device, and no stand-in exists."""


def _conv_backward(grad, x, w, bias_sizes, *rest):
    mask = rest[-1]
    return (torch.empty_like(x) if mask[0] else None,
            torch.empty_like(w) if mask[1] else None,
            grad.new_empty(bias_sizes) if mask[2] and bias_sizes is not None else None)


def _foreach(func, args, kwargs):
    """A multi-tensor op: in place, nothing to make; otherwise one result
    like each tensor of the first list (a norm: one scalar each)."""
    if func._schema.is_mutable:
        return None
    first = next(a for a in args if isinstance(a, (list, tuple)))
    if name(func) == "_foreach_norm":
        return [t.new_empty((), dtype=torch.float32 if not t.is_floating_point()
                            else t.dtype) for t in first]
    return [torch.empty_like(t) for t in first]


_STANDINS = {"convolution_backward": lambda f, a, k: _conv_backward(*a, **k)}


def run_meta(func, args, kwargs):
    """func(*args, **kwargs), with a stand-in that makes results of the right
    shapes where PyTorch has no meta kernel (PyTorch 1.13 lacks the
    convolution backward and the multi-tensor ops there)."""
    try:
        return func(*args, **kwargs)
    except NotImplementedError as e:
        # Only the text: the exception's traceback holds this frame, and with
        # it the op's tensors, in a cycle that would keep them alive until
        # the garbage collector happened to run.
        err = str(e).splitlines()[0]
    n = name(func)
    if n in _STANDINS:
        return _STANDINS[n](func, args, kwargs)
    if is_multi_tensor(func):
        return _foreach(func, args, kwargs)
    try:
        from torch._decomp import decomposition_table
    except ImportError:  # pragma: no cover - every PyTorch with meta tensors has it
        decomposition_table = {}
    decomp = decomposition_table.get(func)
    if decomp is not None:
        return decomp(*args, **kwargs)
    raise MetaUnsupported("%s cannot run on the meta device in PyTorch %s (%s); record with "
                          "a newer PyTorch, or avoid the op" % (func, torch.__version__, err))
