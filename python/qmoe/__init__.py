"""qmoe: Quark-quantized Mixture-of-Experts layers, from Python.

A thin face over the C++ library (include/qmoe/): every check and every computation is the
library's; this package converts arguments and results.

    import numpy as np, qmoe
    ckpt = qmoe.open("path/to/checkpoint")      # config.json + safetensors
    layer = ckpt.layer(ckpt.moe_layers[0])       # device="cpu", kernel="optimized"
    out = layer(np.zeros((4, ckpt.hidden_size), np.float32))
    out.output, out.topk_ids, out.topk_weights   # [T, H] f32, [T, K] int32, [T, K] f32

Errors the library (or this binding) reports raise ``qmoe.Error``, a subclass of ``RuntimeError``,
with the message the CLI prints after ``qmoe: error:``. Arguments of the wrong Python type raise
``TypeError`` as usual.
"""

from __future__ import annotations

import os as _os
from typing import Callable, Iterable, Optional, Union

from ._qmoe import (  # noqa: F401  (re-exported)
    Checkpoint,
    Error,
    Layer,
    LayerOutput,
    __version__,
    cuda_available,
    has_cuda,
    scheme_info,
    schemes,
)

__all__ = [
    "Checkpoint",
    "Error",
    "Layer",
    "LayerOutput",
    "__version__",
    "cuda_available",
    "has_cuda",
    "open",
    "quantize",
    "scheme_info",
    "schemes",
]

PathLike = Union[str, "_os.PathLike[str]"]
ProgressCallback = Callable[[str, int, int], None]


def open(path: PathLike) -> Checkpoint:  # noqa: A001  (the API's name)
    """Open a checkpoint directory (config.json + safetensors); qmoe.Error when it is not one."""
    return Checkpoint.open(path)


def _tqdm_callback() -> Optional[ProgressCallback]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    bars: dict = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            for other in bars.values():
                other.close()
            bytes_stage = not stage.endswith("calibrating")
            bar = bars[stage] = tqdm(total=total, desc=stage, unit="B" if bytes_stage else " layers",
                                     unit_scale=bytes_stage, leave=True)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def quantize(src: PathLike, dst: PathLike, scheme: str, calib: Optional[PathLike] = None,
             exclude: Iterable[str] = (), threads: Optional[int] = None,
             progress: Union[None, bool, ProgressCallback] = None) -> dict:
    """Quantize the MoE experts of the unquantized checkpoint SRC into DST, as ``qmoe quantize``.

    scheme: a name or alias of ``qmoe.schemes()``; calib: calibration safetensors (static schemes);
    exclude: extra Quark exclude patterns (exact, glob or ``re:<regex>``); threads: None = all cores.
    progress: None shows a tqdm bar when tqdm is installed (else the CLI's lines on stderr), False
    nothing, True the CLI's lines on stderr, a callable is called as ``progress(stage, done, total)``
    (an exception it raises stops the job and is re-raised; DST is left as it was).
    Returns the report (counts, files written) as a dict. The GIL is released while it runs.
    """
    callback: Optional[ProgressCallback] = None
    stderr = False
    if callable(progress):
        callback = progress
    elif progress is None:
        callback = _tqdm_callback()
        stderr = callback is None
    elif progress is True:
        stderr = True
    elif progress is not False:
        raise TypeError("progress must be None, a bool or a callable (stage, done, total)")
    if isinstance(exclude, str):
        exclude = [exclude]
    return _qmoe._quantize(src, dst, scheme, calib, list(exclude), threads, stderr, callback)


from . import _qmoe  # noqa: E402
