"""Standard architectures to record by name: `python -m stagehand trace gpt:layers=24`.

Each is written here in plain PyTorch (no torchvision, no transformers), so
that a recording depends only on the shapes below and on PyTorch itself:

- gpt: a GPT-2-style decoder (learned positions, pre-LayerNorm, GELU MLP,
  causal attention as matmul, mask and softmax, tied embeddings), trained
  on next-token cross-entropy. lora=R freezes the weights and trains rank-R
  adapters on the attention and MLP projections; ckpt=1 checkpoints every
  block (torch.utils.checkpoint, non-reentrant).
- resnet: ResNet-50 (or depth=101/152), bottleneck blocks with batch
  norm, cross-entropy on 1000 classes, SGD with momentum.
- vit: a Vision Transformer (ViT-L/16 by default) classifying 224x224 images.
- unet: a small Stable-Diffusion-like UNet: residual blocks with GroupNorm
  and a time embedding, self- and cross-attention (to a 77-token text
  context) at the two lower resolutions, predicting the noise of 64x64x4
  latents (mean squared error).

Every model but resnet trains with AdamW (foreach). dtype is the dtype of
weights, gradients, optimizer state and activations alike (pure bf16 or
fp32 training; no autocast, which the meta device does not run).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class SpecError(ValueError):
    """A model spec that names no model or gives a bad option."""


class Spec:
    """What record() needs: model(device), batch(device), forward, loss, optimizer."""

    def __init__(self, name, opts, model, batch, forward, loss, optimizer):
        self.name, self.opts = name, opts
        self.model, self.batch, self.forward = model, batch, forward
        self.loss, self.optimizer = loss, optimizer

    def describe(self):
        return "%s:%s" % (self.name, ",".join("%s=%s" % kv for kv in sorted(self.opts.items())))


def _first_input(model, batch):
    """Images in, labels kept for the loss."""
    return model(batch[0])


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)


# ---- GPT -------------------------------------------------------------------------

class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update: x W^T + (x A^T) B^T."""

    def __init__(self, cin, cout, rank, **kw):
        super().__init__()
        self.base = nn.Linear(cin, cout, **kw)
        self.base.requires_grad_(False)
        self.a = nn.Parameter(torch.empty(rank, cin, **kw))
        self.b = nn.Parameter(torch.empty(cout, rank, **kw))
        self.scale = 1.0 / rank

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.a), self.b) * self.scale


def _linear(cin, cout, lora, **kw):
    return LoRALinear(cin, cout, lora, **kw) if lora else nn.Linear(cin, cout, **kw)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, seq, lora, **kw):
        super().__init__()
        self.heads = heads
        self.qkv = _linear(d, 3 * d, lora, **kw)
        self.proj = _linear(d, d, lora, **kw)
        self.register_buffer("mask", torch.ones(seq, seq, device=kw["device"],
                                                dtype=torch.bool).tril_().view(1, 1, seq, seq))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, d, heads, seq, lora, **kw):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, **kw)
        self.attn = CausalSelfAttention(d, heads, seq, lora, **kw)
        self.ln2 = nn.LayerNorm(d, **kw)
        self.fc = _linear(d, 4 * d, lora, **kw)
        self.out = _linear(4 * d, d, lora, **kw)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, layers, d, heads, seq, lora=0, ckpt=False, **kw):
        super().__init__()
        self.ckpt = ckpt
        self.wte = nn.Embedding(vocab, d, **kw)
        self.wpe = nn.Embedding(seq, d, **kw)
        self.blocks = nn.ModuleList(GPTBlock(d, heads, seq, lora, **kw) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, **kw)
        if lora:  # adapters only: embeddings and norms stay frozen too
            for m in (self.wte, self.wpe, self.ln_f):
                m.requires_grad_(False)
            for blk in self.blocks:
                blk.ln1.requires_grad_(False)
                blk.ln2.requires_grad_(False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:t]
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=False) \
                if self.ckpt else blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied with the embedding
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _gpt(o):
    if o["d"] % o["heads"]:
        raise SpecError("gpt: d=%d is not a multiple of heads=%d" % (o["d"], o["heads"]))
    kw = dict(dtype=DTYPES[o["dtype"]])

    def model(device):
        return GPT(o["vocab"], o["layers"], o["d"], o["heads"], o["seq"], o["lora"],
                   bool(o["ckpt"]), device=device, **kw)

    def batch(device):
        shape = (o["batch"], o["seq"])
        return (torch.randint(0, o["vocab"], shape, device=device),
                torch.randint(0, o["vocab"], shape, device=device))

    return model, batch, None, lambda out, b: out, _adamw


# ---- ResNet ----------------------------------------------------------------------

class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride, **kw):
        super().__init__()
        cout = width * 4
        self.c1 = nn.Conv2d(cin, width, 1, bias=False, **kw)
        self.b1 = nn.BatchNorm2d(width, **kw)
        self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False, **kw)
        self.b2 = nn.BatchNorm2d(width, **kw)
        self.c3 = nn.Conv2d(width, cout, 1, bias=False, **kw)
        self.b3 = nn.BatchNorm2d(cout, **kw)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False, **kw),
                                      nn.BatchNorm2d(cout, **kw))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


_RESNET_LAYERS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class ResNet(nn.Module):
    def __init__(self, depth, classes, **kw):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False, **kw),
                                  nn.BatchNorm2d(64, **kw), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(_RESNET_LAYERS[depth]):
            width = 64 << i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1, **kw))
                cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes, **kw)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet(o):
    if o["depth"] not in _RESNET_LAYERS:
        raise SpecError("resnet: depth=%d: one of 50, 101, 152" % o["depth"])
    dtype = DTYPES[o["dtype"]]

    def model(device):
        return ResNet(o["depth"], o["classes"], device=device, dtype=dtype)

    def batch(device):
        return (torch.empty(o["batch"], 3, o["res"], o["res"], device=device, dtype=dtype),
                torch.randint(0, o["classes"], (o["batch"],), device=device))

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)

    return model, batch, _first_input, lambda out, b: F.cross_entropy(out, b[1]), sgd


# ---- ViT -------------------------------------------------------------------------

class Attention(nn.Module):
    """Multi-head attention as matmul and softmax; kv from `context` when given."""

    def __init__(self, d, heads, dctx=None, **kw):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, **kw)
        self.kv = nn.Linear(dctx or d, 2 * d, **kw)
        self.proj = nn.Linear(d, d, **kw)

    def forward(self, x, context=None):
        b, t, c = x.shape
        h = self.heads
        ctx = x if context is None else context
        k, v = self.kv(ctx).chunk(2, dim=-1)
        q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
        k, v = (z.view(b, ctx.shape[1], h, c // h).transpose(1, 2) for z in (k, v))
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h)), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class ViTBlock(nn.Module):
    def __init__(self, d, heads, mlp, **kw):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, **kw), nn.LayerNorm(d, **kw)
        self.attn = Attention(d, heads, **kw)
        self.fc, self.out = nn.Linear(d, mlp, **kw), nn.Linear(mlp, d, **kw)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, layers, d, heads, patch, res, classes, **kw):
        super().__init__()
        n = (res // patch) ** 2
        self.embed = nn.Conv2d(3, d, patch, patch, **kw)
        self.cls = nn.Parameter(torch.zeros(1, 1, d, **kw))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, d, **kw))
        self.blocks = nn.ModuleList(ViTBlock(d, heads, 4 * d, **kw) for _ in range(layers))
        self.ln = nn.LayerNorm(d, **kw)
        self.head = nn.Linear(d, classes, **kw)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x[:, 0]))


def _vit(o):
    if o["d"] % o["heads"] or o["res"] % o["patch"]:
        raise SpecError("vit: d must be a multiple of heads, and res of patch")
    dtype = DTYPES[o["dtype"]]

    def model(device):
        return ViT(o["layers"], o["d"], o["heads"], o["patch"], o["res"], o["classes"],
                   device=device, dtype=dtype)

    def batch(device):
        return (torch.empty(o["batch"], 3, o["res"], o["res"], device=device, dtype=dtype),
                torch.randint(0, o["classes"], (o["batch"],), device=device))

    return model, batch, _first_input, lambda out, b: F.cross_entropy(out, b[1]), _adamw


# ---- UNet ------------------------------------------------------------------------

class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb, **kw):
        super().__init__()
        self.n1 = nn.GroupNorm(32, cin, **kw)
        self.c1 = nn.Conv2d(cin, cout, 3, 1, 1, **kw)
        self.t = nn.Linear(temb, cout, **kw)
        self.n2 = nn.GroupNorm(32, cout, **kw)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, **kw)
        self.skip = nn.Conv2d(cin, cout, 1, **kw) if cin != cout else None

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + (self.skip(x) if self.skip is not None else x)


class SpatialTransformer(nn.Module):
    """Self-attention, cross-attention to the text context, and a feed-forward,
    over the pixels of a feature map."""

    def __init__(self, c, heads, dctx, **kw):
        super().__init__()
        self.norm = nn.GroupNorm(32, c, **kw)
        self.proj_in, self.proj_out = nn.Conv2d(c, c, 1, **kw), nn.Conv2d(c, c, 1, **kw)
        self.ln1, self.ln2, self.ln3 = (nn.LayerNorm(c, **kw) for _ in range(3))
        self.attn1 = Attention(c, heads, **kw)
        self.attn2 = Attention(c, heads, dctx, **kw)
        self.ff1, self.ff2 = nn.Linear(c, 4 * c, **kw), nn.Linear(4 * c, c, **kw)

    def forward(self, x, context):
        b, c, hh, ww = x.shape
        h = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        h = h + self.attn1(self.ln1(h))
        h = h + self.attn2(self.ln2(h), context)
        h = h + self.ff2(F.gelu(self.ff1(self.ln3(h))))
        return x + self.proj_out(h.transpose(1, 2).reshape(b, c, hh, ww))


class UNet(nn.Module):
    def __init__(self, ch, mults, blocks, heads, dctx, attn_from, **kw):
        super().__init__()
        temb = 4 * ch
        self.ch = ch
        self.time = nn.Sequential(nn.Linear(ch, temb, **kw), nn.SiLU(), nn.Linear(temb, temb, **kw))
        self.inp = nn.Conv2d(4, ch, 3, 1, 1, **kw)
        self.down, chans, c = nn.ModuleList(), [ch], ch
        for lvl, m in enumerate(mults):
            for _ in range(blocks):
                self.down.append(nn.ModuleList([ResBlock(c, ch * m, temb, **kw)] + (
                    [SpatialTransformer(ch * m, heads, dctx, **kw)] if lvl >= attn_from else [])))
                c = ch * m
                chans.append(c)
            if lvl < len(mults) - 1:
                self.down.append(nn.ModuleList([nn.Conv2d(c, c, 3, 2, 1, **kw)]))
                chans.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, temb, **kw),
                                  SpatialTransformer(c, heads, dctx, **kw),
                                  ResBlock(c, c, temb, **kw)])
        self.up = nn.ModuleList()
        for lvl, m in reversed(list(enumerate(mults))):
            for i in range(blocks + 1):
                layers = [ResBlock(c + chans.pop(), ch * m, temb, **kw)]
                c = ch * m
                if lvl >= attn_from:
                    layers.append(SpatialTransformer(c, heads, dctx, **kw))
                if lvl > 0 and i == blocks:
                    layers.append(nn.Conv2d(c, c, 3, 1, 1, **kw))  # after a 2x upsample
                self.up.append(nn.ModuleList(layers))
        self.out = nn.Sequential(nn.GroupNorm(32, c, **kw), nn.SiLU(),
                                 nn.Conv2d(c, 4, 3, 1, 1, **kw))

    def _apply_layer(self, layer, h, temb, context):
        if isinstance(layer, ResBlock):
            return layer(h, temb)
        if isinstance(layer, SpatialTransformer):
            return layer(h, context)
        return layer(h)

    def forward(self, x, t, context):
        half = self.ch // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=x.device,
                                                          dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        temb = self.time(torch.cat([args.cos(), args.sin()], dim=-1).to(x.dtype))
        h = self.inp(x)
        skips = [h]
        for layers in self.down:
            for layer in layers:
                h = self._apply_layer(layer, h, temb, context)
            skips.append(h)
        for layer in self.mid:
            h = self._apply_layer(layer, h, temb, context)
        for layers in self.up:
            h = torch.cat([h, skips.pop()], dim=1)
            for layer in layers:
                if isinstance(layer, nn.Conv2d):
                    h = F.interpolate(h, scale_factor=2, mode="nearest")
                h = self._apply_layer(layer, h, temb, context)
        return self.out(h)


def _unet(o):
    mults = tuple(int(m) for m in str(o["mults"]).split("-"))
    if o["ch"] % 32:
        raise SpecError("unet: ch=%d must be a multiple of 32 (GroupNorm's groups)" % o["ch"])
    if o["res"] % (1 << (len(mults) - 1)):
        raise SpecError("unet: res=%d must divide by 2 per level" % o["res"])
    dtype = DTYPES[o["dtype"]]

    def model(device):
        return UNet(o["ch"], mults, o["blocks"], o["heads"], o["ctx_dim"], o["attn_from"],
                    device=device, dtype=dtype)

    def batch(device):
        b = o["batch"]
        return (torch.empty(b, 4, o["res"], o["res"], device=device, dtype=dtype),
                torch.randint(0, 1000, (b,), device=device),
                torch.empty(b, o["ctx_len"], o["ctx_dim"], device=device, dtype=dtype),
                torch.empty(b, 4, o["res"], o["res"], device=device, dtype=dtype))

    return (model, batch, lambda m, b: m(b[0], b[1], b[2]),
            lambda out, b: F.mse_loss(out, b[3]), _adamw)


# ---- the table -------------------------------------------------------------------

_MODELS = {
    "gpt": (_gpt, dict(vocab=50304, layers=24, d=2048, heads=16, seq=1024, batch=8,
                       lora=0, ckpt=0, dtype="bf16"),
            "GPT-2-style decoder; lora=RANK trains adapters only, ckpt=1 checkpoints blocks"),
    "resnet": (_resnet, dict(depth=50, batch=128, res=224, classes=1000, dtype="fp32"),
               "ResNet-50/101/152 on ImageNet-sized images, SGD with momentum"),
    "vit": (_vit, dict(layers=24, d=1024, heads=16, patch=16, res=224, classes=1000,
                       batch=64, dtype="bf16"),
            "Vision Transformer (ViT-L/16 by default)"),
    "unet": (_unet, dict(ch=192, mults="1-2-4", blocks=2, heads=8, attn_from=1, res=64,
                         ctx_len=77, ctx_dim=768, batch=8, dtype="bf16"),
             "small Stable-Diffusion-like UNet on 64x64x4 latents"),
}


def names():
    return sorted(_MODELS)


def describe_all():
    """One paragraph per model: its options and defaults."""
    out = []
    for n in names():
        _, defaults, what = _MODELS[n]
        out.append("%s: %s\n    %s" % (n, what, ",".join("%s=%s" % kv for kv in defaults.items())))
    return "\n".join(out)


def _value(model, key, default, text):
    if key == "dtype":
        if text not in DTYPES:
            raise SpecError("%s: dtype=%s: one of %s" % (model, text, ", ".join(DTYPES)))
        return text
    if isinstance(default, int):
        try:
            v = int(text)
        except ValueError:
            raise SpecError("%s: %s=%s: expected a whole number" % (model, key, text)) from None
        if v < 0 or (v == 0 and key not in ("lora", "ckpt", "attn_from")):
            raise SpecError("%s: %s=%d: must be positive" % (model, key, v))
        return v
    if key == "mults" and not all(p.isdigit() and int(p) > 0 for p in text.split("-")):
        raise SpecError("%s: mults=%s: expected positive whole numbers joined by '-', "
                        "e.g. 1-2-4" % (model, text))
    return text


def parse(spec):
    """A Spec from "NAME[:KEY=VALUE,...]"; raises SpecError saying what is wrong."""
    name, _, rest = str(spec).partition(":")
    name = name.strip().lower()
    if name not in _MODELS:
        raise SpecError("unknown model %r: one of %s, or a Python file" % (name, ", ".join(names())))
    build, defaults, _ = _MODELS[name]
    opts = dict(defaults)
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise SpecError("%s: %r: expected KEY=VALUE with KEY one of %s"
                            % (name, part, ", ".join(defaults)))
        opts[key] = _value(name, key, defaults[key], val.strip())
    return Spec(name, opts, *build(opts))
