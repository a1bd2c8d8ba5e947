"""qmoe.torch: a qmoe layer as a ``torch.nn.Module``.

    import torch, qmoe.torch
    moe = qmoe.torch.MoE("path/to/checkpoint", layer=0)    # or MoE(qmoe.open(path), 0, threads=4)
    y = moe(hidden_states)                                   # [..., H] → [..., H] float32
    y, topk_ids, topk_weights = moe(hidden_states, return_routing=True)

The forward goes through the custom op ``torch.ops.qmoe.moe`` (torch.library.custom_op) with a
fake implementation, so ``torch.compile`` traces it as one opaque node with known output shapes.
Inside the op the inputs are made contiguous and detached (the layer is inference-only: no
gradient flows through it). With ``device="cuda"`` (or ``"cuda:N"``) and CUDA tensors on that GPU
the whole layer runs there: inputs read in place, outputs allocated by torch on the device, the
work on the current stream with no host synchronisation, so the module can be captured in a CUDA
graph (run it once with as many tokens first, or call ``moe.layer.reserve(T)``). Tensors on another
device than the layer's go through the host.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Optional, Tuple, Union

import torch

import qmoe

__all__ = ["MoE", "moe"]

# Custom ops take tensors and scalars, so each MoE module registers its layer under an integer
# handle; the handle goes away with the module.
_layers: "dict[int, qmoe.Layer]" = {}
_next_handle = itertools.count(1)
_lock = threading.Lock()


def _layer(handle: int) -> qmoe.Layer:
    try:
        return _layers[handle]
    except KeyError:
        raise qmoe.Error(f"qmoe.torch: no layer is registered under handle {handle} (its MoE module was deleted)")


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _on_layer_device(layer: qmoe.Layer, t: torch.Tensor) -> bool:
    if not layer.device.startswith("cuda"):
        return False
    want = 0 if layer.device == "cuda" else int(layer.device[5:])
    return t.device.index == want


@torch.library.custom_op("qmoe::moe", mutates_args=())
def moe(hidden_states: torch.Tensor, router_logits: Optional[torch.Tensor], handle: int
        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out [T, H] f32, topk_ids [T, K] int32, topk_weights [T, K] f32 = layer `handle` (hidden, logits)."""
    layer = _layer(handle)
    if hidden_states.is_cuda and _on_layer_device(layer, hidden_states):
        lg = None if router_logits is None else router_logits.detach().to(hidden_states.device).contiguous()
        out = layer(hidden_states.detach().contiguous(), lg)
        return out.output, out.topk_ids, out.topk_weights
    out = layer(_host(hidden_states), None if router_logits is None else _host(router_logits))
    dev = hidden_states.device
    return out.output.to(dev), out.topk_ids.to(dev), out.topk_weights.to(dev)


@moe.register_fake
def _moe_fake(hidden_states, router_logits, handle):
    layer = _layer(handle)
    T = hidden_states.shape[0]
    return (hidden_states.new_empty((T, layer.hidden_size), dtype=torch.float32),
            hidden_states.new_empty((T, layer.top_k), dtype=torch.int32),
            hidden_states.new_empty((T, layer.top_k), dtype=torch.float32))


class MoE(torch.nn.Module):
    """One MoE layer of a Quark checkpoint. ``ckpt``: a ``qmoe.Checkpoint`` or a checkpoint path;
    ``layer``: the decoder layer index (default: the first MoE layer); the keyword arguments are
    those of ``Checkpoint.layer`` (device, kernel, threads, tp, ep)."""

    def __init__(self, ckpt: Union["qmoe.Checkpoint", str], layer: Optional[int] = None, **options):
        super().__init__()
        if not isinstance(ckpt, qmoe.Checkpoint):
            ckpt = qmoe.open(ckpt)
        if layer is None:
            if not ckpt.moe_layers:
                raise qmoe.Error(f"{ckpt.path} has no MoE layer")
            layer = ckpt.moe_layers[0]
        self.layer = ckpt.layer(layer, **options)
        with _lock:
            self.handle = next(_next_handle)
            _layers[self.handle] = self.layer
        weakref.finalize(self, _layers.pop, self.handle, None)

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def top_k(self) -> int:
        return self.layer.top_k

    def forward(self, hidden_states: torch.Tensor, router_logits: Optional[torch.Tensor] = None,
                return_routing: bool = False):
        """hidden_states [..., H] (bf16 / f16 / f32), router_logits [..., E] or None (the
        checkpoint's router). Returns the output [..., H] float32 (and, with return_routing,
        topk_ids [..., K] int32 and topk_weights [..., K] float32)."""
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        lg = None if router_logits is None else router_logits.reshape(-1, router_logits.shape[-1])
        out, ids, w = moe(x, lg, self.handle)
        out = out.reshape(*lead, out.shape[-1])
        if not return_routing:
            return out
        return out, ids.reshape(*lead, ids.shape[-1]), w.reshape(*lead, w.shape[-1])

    def extra_repr(self) -> str:
        return repr(self.layer)
