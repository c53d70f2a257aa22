"""A policy worker's checkpoints: HF weights (or the PEFT adapter, and the merged weights with `save_merged`),
the action head's file, the tokenizer and processor, DCP shards of a sharded run, and the optimizer/RNG state
(`ascent.trainer.common`). `PolicyWorker.save` and `.load` call these.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ascent.models.action_head import attach_action_head, save_action_head, without_action_head
from ascent.models.files import copy_processor_files
from ascent.models.loading import load_model, load_tokenizer
from ascent.models.parallel import full_state_dict, has_shards, load_full_state_dict, load_shards, save_shards
from ascent.trainer import common, lora_sharded
from ascent.trainer import lora as lora_lib
from ascent.trainer.logprobs import unwrap_model

if TYPE_CHECKING:
    from ascent.trainer.policy import PolicyWorker


def save_policy(w: PolicyWorker, out: Path, optimizer: bool = True, hf_weights: bool = True) -> None:
    """Write HF weights (merged for LoRA when `save_merged`), the adapter, tokenizer, trainer_state.pt.

    Sharded (a collective): every rank writes its shards of the weights (`model_shards/`, the resume
    state), of the optimizer (`optimizer_shards/`) and its RNG (`rng_rank*.pt`); rank 0 also writes
    gathered HF weights when `hf_weights`, the only step that gathers the model. Unsharded, the HF
    weights are the resume state and always written.
    """
    model = unwrap_model(w.model)
    if w.sharded and w.lora is not None:
        lora_sharded.save_adapter_shards(w.model, out)
    elif w.sharded:
        save_shards(model, out)
    export = hf_weights or not w.sharded
    gathered = _gather_export(w) if w.sharded and export else {}
    if not common.write_shard(w, out, optimizer, rng=True):
        return  # rank 0 writes the rest: unsharded, its state is every rank's; sharded, it gathered
    out.mkdir(parents=True, exist_ok=True)
    if w.lora is not None:
        _write_lora(w, out, export, gathered)
    elif export:
        with without_action_head(model):  # the head has its own file (save_action_head)
            model.save_pretrained(str(out), state_dict=gathered.get("weights"))
        save_action_head(model, out)
    else:
        model.config.save_pretrained(str(out))  # what the shards are weights of
    with contextlib.suppress(OSError, ValueError):
        load_tokenizer(w.tokenizer_path).save_pretrained(str(out))
    copy_processor_files(w.model_path, out)
    common.write_state(w, out, optimizer)


def _gather_export(w: PolicyWorker) -> dict[str, Any]:
    """What a sharded export needs in full, on rank 0 (a collective): the weights, or the adapter and
    (with `save_merged`) the merged weights."""
    if w.lora is None:
        return {"weights": full_state_dict(unwrap_model(w.model))}
    keep = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    out: dict[str, Any] = {"adapter": lora_sharded.gathered_adapter(w.model)}
    if w.lora.save_merged:
        merged = lora_sharded.merged_full_weights(w.model)
        out["merged"] = {n: t.cpu().clone() for n, t in merged if keep}  # ranks > 0 take part, keep none
    return out


def _write_lora(w: PolicyWorker, out: Path, export: bool, gathered: dict[str, Any]) -> None:
    """Rank 0: the PEFT adapter and the merged weights (`save_merged`), when an export is due; sharded
    without one, only the adapter config (the adapter itself is in adapter_shards/)."""
    assert w.lora is not None
    adapter_dir = out / lora_lib.ADAPTER_DIR
    if not export:
        lora_lib.write_adapter_config(w.model, adapter_dir)
        return
    lora_lib.write_adapter(w.model, adapter_dir, gathered.get("adapter"))
    if w.lora.save_merged:
        lora_lib.write_merged(w.model, out, gathered.get("merged"))


def load_policy(w: PolicyWorker, src: Path) -> None:
    """Restore weights (adapter for LoRA), optimizer, scheduler, scaler, step and RNG from `save(dir)`.

    DCP shards (`model_shards/`) are preferred over the HF weights and load on any number of ranks; a
    collective when this run is sharded.
    """
    if w.lora is not None:
        _load_adapter(w, src)
    elif has_shards(src):  # each rank reads the slices it holds, whatever number of ranks wrote them
        load_shards(unwrap_model(w.model), src)
    else:
        fresh = load_model(src, w.param_dtype, "cpu")
        if w.action_head is not None:
            attach_action_head(fresh, w.action_head, src)
        load_full_state_dict(unwrap_model(w.model), fresh.state_dict())
    common.load_state(w, src, rng=True)


def _load_adapter(w: PolicyWorker, src: Path) -> None:
    """Adapter shards (any number of ranks) if the checkpoint has them, else the PEFT adapter."""
    if lora_sharded.has_adapter_shards(src):
        lora_sharded.load_adapter_shards(w.model, src)
    elif w.sharded:
        lora_sharded.load_full_adapter(w.model, src / lora_lib.ADAPTER_DIR)
    else:
        lora_lib.load_adapter_weights(w.model, src / lora_lib.ADAPTER_DIR)
