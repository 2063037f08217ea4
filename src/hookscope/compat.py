"""The one module that touches private torch APIs.

hookscope needs a few things torch does not (yet) expose publicly: the dispatch-mode base class, the fused
``_foreach`` kernels, a hook handle's registry, the markers ``torch.compile`` leaves on a module, and a
tensor's in-place version counter. Each is wrapped here, once, with the torch versions it was checked on,
so a torch upgrade that moves one of them breaks this file and its test (``tests/test_compat.py``) and
nothing else; ``tests/test_private_torch_apis.py`` keeps every other file off private torch names.

The wrappers add no behaviour: each does exactly what the private call it wraps does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

# Checked on 2.14.1 (the pinned version). The base class of ``__torch_dispatch__`` modes (used by
# find_nonfinite's op trace and the FLOP counter): documented in the "extending torch" notes, yet it lives
# in a private module. Present under this path throughout torch 2.x (added in the 1.12/1.13 era).
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.hooks import RemovableHandle

__all__ = [
    "MARK_DYNAMIC",
    "ORIGINAL_MODULE_ATTR",
    "SDPA_FLASH_CPU",
    "TorchDispatchMode",
    "compile_in_use",
    "compile_records",
    "flag_non_finite_",
    "foreach_copy_",
    "foreach_norm",
    "foreach_sub_",
    "hook_dict_of",
    "is_compile_wrapper",
    "is_compiled_in_place",
    "is_compiled_module",
    "on_compile_end",
    "recompile_limit",
    "skip_step_if",
    "skips_steps_on_device",
    "tensor_version",
    "uncompiled",
]

# Checked on 2.14.1. The attribute of torch.compile's wrapper (``OptimizedModule``) that holds the user's
# module, since torch 2.0. Named here so that error messages can tell users about it.
ORIGINAL_MODULE_ATTR = "_orig_mod"

# Checked on 2.14.1. The function that marks a tensor's dimension as changing between calls, so that
# torch.compile builds one graph for all its sizes (since 2.0; no public alias yet). Named here so that
# the recompiles finding can tell users about it.
MARK_DYNAMIC = "torch._dynamo.mark_dynamic"

# Checked on 2.14.1. The flash-attention kernel that ``scaled_dot_product_attention`` picks on CPU (since
# torch 2.2); an internal aten op that torch's own FLOP formulas do not cover, so the summary counts it.
SDPA_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


# ------------------------------------------------------------------------------------------ foreach kernels


def foreach_norm(tensors: Sequence[torch.Tensor], ord: float = 2) -> list[torch.Tensor]:
    """``torch._foreach_norm``: the ``ord``-norm of each tensor, one 0-dim tensor each, in one fused launch
    per device and dtype (what ``clip_grad_norm_`` uses). Each norm keeps its tensor's dtype and device.

    Checked on 2.14.1; present throughout torch 2.x (``clip_grad_norm_`` relies on it).
    """
    return list(torch._foreach_norm(list(tensors), ord))


def foreach_copy_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``torch._foreach_copy_``: ``d.copy_(s)`` for every pair, fused.

    Checked on 2.14.1; added in torch 2.1 (pytorch/pytorch#107226).
    """
    torch._foreach_copy_(list(dst), list(src))


def foreach_sub_(tensors: Sequence[torch.Tensor], other: Sequence[torch.Tensor]) -> None:
    """``torch._foreach_sub_``: ``t.sub_(o)`` for every pair, fused.

    Checked on 2.14.1; one of the first foreach ops (torch 1.7).
    """
    torch._foreach_sub_(list(tensors), list(other))


def flag_non_finite_(tensors: Sequence[torch.Tensor], found: torch.Tensor, one: torch.Tensor) -> bool:
    """``torch._amp_foreach_non_finite_check_and_unscale_`` with an inverse scale of 1: sets the float32
    0-d ``found`` to 1.0 when a value of ``tensors`` is NaN or infinite, in one fused kernel whatever
    their number and dtypes, with no host sync (what ``GradScaler`` uses). ``one`` is a float32 1 on
    their device. The values are written back unchanged (the kernel returns them as they are when the
    scale is 1) and their version counters stay as they were. False, with nothing done, where no kernel
    takes these tensors (sparse ones, tensors on several devices, a backend without it).

    Checked on 2.14.1, on the CPU and on CUDA.
    """
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(list(tensors), found, one)
    except (NotImplementedError, RuntimeError):
        return False
    return True


# --------------------------------------------------------------------------- steps skipped on the device


def skips_steps_on_device(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt.step()`` can leave its update out on the device, from a flag it is handed
    (:func:`skip_step_if`), and holds no flag yet: the fused optimizers (``fused=True``: Adam, AdamW,
    SGD, Adagrad) say so to ``GradScaler`` with ``_step_supports_amp_scaling``; inside
    ``GradScaler.step`` the optimizer holds the scaler's flag and scale, which must stay.

    Checked on 2.14.1; the attribute and the fused optimizers' ``found_inf`` exist since torch 2.0.
    """
    return bool(getattr(opt, "_step_supports_amp_scaling", False)) and "found_inf" not in vars(opt)


def skip_step_if(opt: torch.optim.Optimizer, found: torch.Tensor | None) -> None:
    """Hand ``opt`` the float32 0-d ``found`` on its parameters' device: its next ``step()`` changes
    neither the parameters nor its state (moments, step counts) where ``found`` is not 0, decided on the
    device, with no host read. It is what ``GradScaler.step`` hands a fused optimizer, with ``grad_scale``
    None (the gradients are not scaled). ``None`` takes the flag back.

    Checked on 2.14.1: ``torch/optim/adam.py``, ``sgd.py`` and ``adagrad.py`` read both attributes with
    ``getattr`` at each step.
    """
    if found is None:
        opt.__dict__.pop("grad_scale", None)
        opt.__dict__.pop("found_inf", None)
        return
    opt.grad_scale, opt.found_inf = None, found


# ------------------------------------------------------------------------------------------------- hooks


def hook_dict_of(handle: RemovableHandle) -> dict[int, Any] | None:
    """The hook registry ``handle`` removes its hook from, or None when that owner (module, tensor) is gone.

    ``handle.hooks_dict_ref`` is a weakref to the owner's dict of hooks keyed by ``handle.id``; torch has no
    public "is this hook still registered" query. Checked on 2.14.1; the attribute exists since torch 1.0.
    """
    return handle.hooks_dict_ref()


# ----------------------------------------------------------------------------------------- torch.compile


def compile_in_use() -> bool:
    """Whether anything can be compiled in this process: ``torch.compile`` imports ``torch._dynamo``.

    So does the first torch optimizer a process makes (``Optimizer.add_param_group`` runs under
    ``torch._disable_dynamo``, which imports it): in a training loop this is true whether or not anything
    is compiled; it can be false where no optimizer was made (a summary, inference).
    Checking ``sys.modules`` avoids importing dynamo (about a second) just to learn nothing is compiled.
    Checked on 2.14.1 (``torch._dynamo.eval_frame`` since 2.0).
    """
    return "torch._dynamo.eval_frame" in sys.modules


def is_compile_wrapper(module: nn.Module) -> bool:
    """``module`` is the wrapper ``torch.compile(model)`` returns (``OptimizedModule``, since torch 2.0).

    False without importing dynamo when it is not loaded (then nothing was compiled). Checked on 2.14.1.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)


def is_compiled_in_place(module: nn.Module) -> bool:
    """``module.compile()`` was called: its ``__call__`` now runs a compiled graph.

    ``nn.Module.compile`` stores the compiled call in ``_compiled_call_impl`` (None otherwise), since torch
    2.2. Checked on 2.14.1.
    """
    return getattr(module, "_compiled_call_impl", None) is not None


def is_compiled_module(module: nn.Module) -> bool:
    """Either form of ``torch.compile``: the wrapper, or a module compiled in place."""
    return is_compile_wrapper(module) or is_compiled_in_place(module)


def uncompiled(model: Any) -> Any:
    """The user's module inside a ``torch.compile`` wrapper (its ``_orig_mod``); anything else unchanged.

    Checked on 2.14.1 (``OptimizedModule._orig_mod`` since 2.0).
    """
    return getattr(model, ORIGINAL_MODULE_ATTR, model)


def on_compile_end(callback: Callable[[str], None]) -> Callable[[], None]:
    """Call ``callback(compile_id)`` after each compilation of a Python frame by dynamo (not the deferred
    backward graphs); returns the function that unregisters it (a no-op once ``torch.compiler.reset()``
    cleared them all). ``compile_id`` reads ``"frame/n"``: the ``n``-th compilation of that frame, 0 the
    first.

    torch has no public hook for "a compilation happened"; ``torch._dynamo.callback.callback_handler`` is
    the registry dynamo runs at the start and end of each compilation. Checked on 2.14.1 (since 2.5).
    """
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    def ended(args: Any) -> None:
        if args.callback_trigger is CallbackTrigger.DYNAMO:
            callback(str(args.compile_id))

    def remove() -> None:
        if ended in callback_handler.end_callbacks:  # torch.compiler.reset() clears the registry
            callback_handler.remove_end_callback(ended)

    callback_handler.register_end_callback(ended)
    return remove


def compile_records() -> list[Any]:
    """dynamo's records of the process's last compilations (at most 64, oldest first), each with
    ``compile_id``, ``co_name``, ``co_filename``, ``co_firstlineno``, ``is_forward``, ``fail_type``,
    ``fail_reason`` and ``recompile_reason`` — the first guard that failed, the text that
    ``TORCH_LOGS=recompiles`` prints. Empty when dynamo is not loaded.

    ``torch._dynamo.utils.get_compilation_metrics``: the reasons are kept there whether or not logging is
    on. Checked on 2.14.1 (``recompile_reason`` since 2.5).
    """
    utils = sys.modules.get("torch._dynamo.utils")
    return utils.get_compilation_metrics() if utils is not None else []


def recompile_limit() -> int:
    """How many times dynamo compiles one frame before it runs it uncompiled for good
    (``torch._dynamo.config.recompile_limit``, 8 by default). Checked on 2.14.1 (named so since 2.6)."""
    from torch._dynamo import config

    return int(config.recompile_limit)


# ----------------------------------------------------------------------------------------------- tensors


def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter: it grows with every in-place op on the tensor (or a view sharing its
    memory), so an unchanged value proves nothing wrote to it. Autograd uses it to detect in-place
    modification; torch exposes it only as ``Tensor._version``. Checked on 2.14.1 (exists since 0.4)."""
    return tensor._version


def graph_task_id() -> int:
    """The id of the backward pass running now (autograd's graph task), -1 outside one: two parameters
    reached by the same backward see the same id. torch exposes it only as
    ``torch._C._current_graph_task_id``. Checked on 2.14.1 (added in 2.0); -1 where it is missing."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return int(current()) if current is not None else -1
