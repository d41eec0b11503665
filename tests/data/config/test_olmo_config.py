"""OLMo's own training YAML (allenai/OLMo's configs/official-1124 and official-0425) run as it is published: the
fixture below has the keys and value forms of OLMo2-7B-stage1.yaml (a few of its paths and evaluators), the
1B file's `wandb:` section and `${run_name}` strings, and nothing else is changed but size, data and duration."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.config import ConfigError, config_to_dict, load_config, read_run_config, save_config
from olmo_data.config.olmo import olmo_form_key, resolve_interpolations

REPO = Path(__file__).resolve().parents[3]

OLMO2_7B_SHAPED = """\
run_name: OLMo2-7B-stage1
seed: 6198
dry_run: false

model:
  d_model: 4096
  n_heads: 32
  n_layers: 32
  mlp_hidden_size: 22016
  weight_tying: false
  alibi: false
  rope: true
  rope_theta: 500000
  flash_attention: true
  attention_dropout: 0.0
  include_bias: false
  block_type: sequential
  layer_norm_type: rms
  layer_norm_with_affine: true
  layer_norm_eps: 1e-6
  bias_for_layer_norm: false
  attention_layer_norm: true
  attention_layer_norm_with_affine: true
  norm_after: true
  activation_type: swiglu
  residual_dropout: 0.0
  embedding_dropout: 0.0
  max_sequence_length: 4096
  vocab_size: 100278
  embedding_size: 100352
  eos_token_id: 100257
  pad_token_id: 100277
  init_device: meta
  init_fn: normal
  init_std: 0.02
  init_cutoff_factor: 3

softmax_auxiliary_loss: true
auxiliary_loss_multiplier: 1e-5
fused_loss: true

compile: null

optimizer:
  name: adamw
  learning_rate: 3.0e-4
  weight_decay: 0.1
  eps: 1e-8
  decay_norm_and_bias: true
  decay_embeddings: false
  betas:
  - 0.9
  - 0.95
  metrics_log_interval: 1

scheduler:
  name: cosine_with_warmup
  units: tokens
  t_warmup: 8388608000
  t_max: 5e12
  alpha_f: 0.1
  warmup_min_lr: 0.0

tokenizer:
  identifier: tokenizers/allenai_dolma2.json
  truncate_direction: right

save_overwrite: false

save_interval: 1000
save_interval_ephemeral: 250
save_num_checkpoints_to_keep: 0
sharded_checkpointer: olmo_core

save_interval_unsharded: 1000
save_num_unsharded_checkpoints_to_keep: -1

load_path: null

max_duration: 1ep
global_train_batch_size: 1024
device_train_microbatch_size: 2

precision: amp_bf16

fsdp:
  wrapping_strategy: by_block_and_size
  precision: mixed

max_grad_norm: 1.0
max_grad_norm_ratio: null

speed_monitor:
  window_size: 1

gen1_gc_interval: 1

eval_interval: 1000
eval_subset_num_batches: -1
device_eval_batch_size: ${device_train_microbatch_size}
evaluators:
  - label: piqa
    type: downstream

  - label: hellaswag
    type: downstream

  - label: mmlu_stem_mc_5shot
    type: downstream

data:
  pad_direction: right
  num_workers: 32
  drop_last: true
  pin_memory: true
  prefetch_factor: 8
  persistent_workers: true
  memmap_dtype: uint32
  timeout: 0
  instance_filter:
    repetition_max_period: 13
    repetition_min_period: 1
    repetition_max_count: 32
  paths:
    - http://olmo-data.org/preprocessed/pes2o/allenai/dolma2-tokenizer/part-00-00000.npy
    - http://olmo-data.org/preprocessed/pes2o/allenai/dolma2-tokenizer/part-01-00000.npy
"""

# the overrides of the end-to-end run: size, data, duration and the schedule's length, nothing else
SEQ = 32
TINY = [
    "--model.d_model=32",
    "--model.n_heads=2",
    "--model.n_layers=2",
    "--model.mlp_hidden_size=128",  # OLMo's fused width: our SwiGLU hidden size is 64
    f"--model.max_sequence_length={SEQ}",
    "--model.vocab_size=256",
    "--model.embedding_size=256",
    "--model.eos_token_id=0",
    "--model.pad_token_id=1",
    "--global_train_batch_size=4",
    "--max_duration=384T",  # 3 steps of 4 x 32 tokens
    "--scheduler.t_warmup=128",  # tokens, as the file counts them
    "--scheduler.t_max=384",
]


def olmo_file(tmp_path: Path, text: str = OLMO2_7B_SHAPED, name: str = "OLMo2-7B-stage1.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def shaped(**changes: Any) -> str:
    """The fixture with some keys changed (dotted names; None removes the key), as YAML text."""
    raw = yaml.safe_load(OLMO2_7B_SHAPED)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return yaml.safe_dump(raw, sort_keys=False)


def write_tokens(directory: Path) -> list[str]:
    """Two headerless uint32 token files (OLMo's memmap_dtype in the file), 24 instances of 32 tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for name, n in (("a.npy", 14 * SEQ), ("b.npy", 10 * SEQ + 3)):
        path = directory / name
        rng.integers(2, 256, n).astype(np.uint32).tofile(path)
        paths.append(str(path))
    return paths


@pytest.mark.slow
def test_the_published_form_runs_with_only_size_data_and_duration_changed(tmp_path: Path) -> None:
    """torchrun, 2 ranks on CPU: three steps; the not-applicable keys in one log line (rank 0 only); the run's
    config.yaml is ours and loads again as the same config."""
    config = olmo_file(tmp_path)
    data = write_tokens(tmp_path / "tokens")
    run = tmp_path / "run"  # the file sets no save_folder: OLMo's default "./", the working directory
    run.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "olmo_train",
        str(config),
        *TINY,
        f"--data.paths=[{','.join(data)}]",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=run, env=env, text=True, capture_output=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    notes = [line for line in out.splitlines() if "not applicable here" in line]
    assert len(notes) == 1, out
    for key in (
        "dry_run",
        "fsdp.wrapping_strategy",
        "data.num_workers",
        "tokenizer.truncate_direction",
        "gen1_gc_interval",
    ):
        assert key in notes[0]
    assert "tokenizer.identifier" not in notes[0] and "downstream" not in notes[0]  # honoured: see test_downstream
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "train/loss" in r] == [1, 2, 3]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert olmo_form_key(saved) is None
    again = load_config(run / "config.yaml")
    assert config_to_dict(again) == saved
    assert again.model.mlp_hidden_size == 64 and again.model.flash_attention
    assert again.z_loss_multiplier == 1e-5 and again.data.instance_filter.enabled
    assert again.device_eval_batch_size == 2 and again.data.dtype == "uint32"
    assert (again.scheduler.units, again.scheduler.t_warmup, again.scheduler.t_max) == ("tokens", 128, 384)
    assert (again.save_interval, again.save_num_checkpoints_to_keep) == (250, 1)  # OLMo's ephemeral checkpoints


def test_the_published_form_maps_onto_ours(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        cfg = load_config(olmo_file(tmp_path))
    notes = [r.getMessage() for r in caplog.records if "not applicable" in r.getMessage()]
    assert len(notes) == 1 and "OLMo's config form (it has 'dry_run')" in notes[0]
    assert "model.init_device" in notes[0] and "optimizer.metrics_log_interval" in notes[0]
    m = cfg.model
    assert (m.d_model, m.n_heads, m.n_layers, m.mlp_hidden_size) == (4096, 32, 32, 11008)
    assert (m.vocab_size, m.embedding_size, m.eos_token_id, m.max_sequence_length) == (100278, 100352, 100257, 4096)
    assert (m.layer_norm_type, m.layer_norm_eps, m.rope_theta, m.init_std) == ("rms", 1e-6, 500000.0, 0.02)
    assert m.norm_after and m.attention_layer_norm and not m.weight_tying
    o, s = cfg.optimizer, cfg.scheduler
    assert (o.learning_rate, o.eps, o.decay_norm_and_bias, o.betas) == (3e-4, 1e-8, True, [0.9, 0.95])
    assert (s.t_warmup, s.t_max, s.alpha_f, s.units) == (8388608000, 5_000_000_000_000, 0.1, "tokens")
    assert (cfg.max_duration, cfg.precision, cfg.compile, cfg.max_grad_norm) == ("1ep", "amp_bf16", False, 1.0)
    assert (cfg.save_interval_unsharded, cfg.save_num_unsharded_checkpoints_to_keep) == (1000, -1)
    assert [(e.label, e.type) for e in cfg.evaluators][0] == ("piqa", "downstream") and not cfg.wandb.enabled
    filt = cfg.data.instance_filter
    assert (filt.repetition_max_period, filt.repetition_min_period, filt.repetition_max_count) == (13, 1, 32)
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg


def test_keys_a_file_leaves_out_take_olmos_defaults(tmp_path: Path) -> None:
    text = shaped(
        max_grad_norm=None, precision=None, optimizer__eps=None, scheduler__warmup_min_lr=None, data__memmap_dtype=None
    )
    cfg = load_config(olmo_file(tmp_path, text))
    assert cfg.max_grad_norm is None and cfg.precision == "fp32"  # OLMo: no clipping, full precision
    assert cfg.optimizer.eps == 1e-5 and cfg.data.dtype == "uint16"
    assert cfg.scheduler.warmup_min_lr == pytest.approx(3e-5)  # a tenth of the peak
    text = shaped(softmax_auxiliary_loss=False, wandb={"name": "${run_name}", "project": "olmo-small"})
    cfg = load_config(olmo_file(tmp_path, text))
    assert cfg.z_loss_multiplier is None
    assert (cfg.wandb.enabled, cfg.wandb.name, cfg.wandb.project) == (True, "OLMo2-7B-stage1", "olmo-small")
    cfg = load_config(olmo_file(tmp_path, shaped(model__mlp_hidden_size=None, model__mlp_ratio=8, model__d_model=64)))
    assert cfg.model.mlp_hidden_size == 256  # the 1B file's form: mlp_ratio * d_model is the fused width


def test_save_keys_as_olmo_uses_them(tmp_path: Path) -> None:
    cfg = load_config(olmo_file(tmp_path, shaped(save_num_checkpoints_to_keep=3)))
    assert (cfg.save_interval, cfg.save_num_checkpoints_to_keep) == (1000, 3)
    cfg = load_config(olmo_file(tmp_path, shaped(save_num_unsharded_checkpoints_to_keep=0)))
    assert cfg.save_interval_unsharded is None


def test_lm_and_downstream_evaluators_are_ours(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lm = {"label": "ppl", "data": {"num_workers": 0, "memmap_dtype": "uint32", "datasets": {"c4": ["c4.npy"]}}}
    with caplog.at_level(logging.INFO):
        cfg = load_config(olmo_file(tmp_path, shaped(evaluators=[lm, {"label": "piqa", "type": "downstream"}])))
    assert [(e.label, e.type, e.paths, e.dtype, e.max_batches) for e in cfg.evaluators] == [
        ("c4", "lm", ["c4.npy"], "uint32", None),
        ("piqa", "downstream", [], None, None),
    ]
    assert "evaluators.0.data.num_workers" in caplog.text


def test_overrides_use_olmos_names_and_interpolations_follow_them(tmp_path: Path) -> None:
    cfg = load_config(olmo_file(tmp_path), ["--device_train_microbatch_size=4", "--model.mlp_hidden_size=512"])
    assert (cfg.device_eval_batch_size, cfg.model.mlp_hidden_size) == (4, 256)
    cfg = load_config(olmo_file(tmp_path), ["--data.prefetch_batches=2", "--distributed_strategy=ddp"])  # ours only
    assert (cfg.data.prefetch_batches, cfg.distributed_strategy) == (2, "ddp")


def test_interpolation() -> None:
    raw = {
        "run_name": "r1",
        "a": "${b}",
        "b": "${model.n}",
        "model": {"n": 7, "s": "runs/${run_name}/x${model.n}", "l": ["${run_name}"]},
        "c": "${model}",
    }
    out = resolve_interpolations(raw)
    assert out["a"] == 7 and out["b"] == 7  # nested, and a whole value keeps its type
    assert out["model"]["s"] == "runs/r1/x7" and out["model"]["l"] == ["r1"]
    assert out["c"]["s"] == "runs/r1/x7"
    assert raw["a"] == "${b}"  # the input is left as it was


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"a": "${b}", "b": "${a}"}, r"config key 'a': interpolation cycle a -> b -> a$"),
        ({"a": "x${a}"}, r"config key 'a': interpolation cycle a -> a$"),
        ({"m": {"k": "${m}"}}, r"config key 'm\.k': interpolation cycle m\.k -> m$"),
        ({"a": "${b.c}", "b": {"c": "${d}"}, "d": "${a}"}, r"interpolation cycle a -> b\.c -> d -> a$"),
        ({"a": "${nope}"}, r"config key 'a': \$\{nope\} names no key of the config"),
        ({"a": "${oc.decode:1}"}, r"config key 'a': \$\{oc\.decode:1\} is an OmegaConf resolver"),
        ({"a": "${path.last_checkpoint:runs}"}, r"\$\{path\.last_checkpoint:runs\} is an OmegaConf resolver"),
        ({"a": "${oc.env:OLMO_TEST_UNSET_VARIABLE}"}, r"environment variable OLMO_TEST_UNSET_VARIABLE is not set"),
        ({"a": "${path.glob:/nonexistent/*.npy}"}, r"/nonexistent/\*\.npy matches no file or folder"),
        ({"a": "${.b}", "b": 1}, r"relative reference"),
        ({"a": "x${m}", "m": {"k": 1}}, r"config key 'a': a reference inside a string names a section"),
    ],
)
def test_interpolation_refusals(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_interpolations(raw)


def test_nested_references_resolve_inner_first_as_omegaconf_does() -> None:
    raw = {"seed": 6198, "model": {6198: "m", "x": {"y": 5}}, "k": "x", "run": "run-${model.${seed}}"}
    raw |= {"whole": "${model.${k}.y}", "mixed": "p${model.${k}.y}q${k}"}
    out = resolve_interpolations(raw)
    assert (out["run"], out["whole"], out["mixed"]) == ("run-m", 5, "p5qx")  # OmegaConf 2.3 gives the same


def test_doubling_interpolations_are_resolved_once_per_key_and_bounded() -> None:
    raw: dict[str, Any] = {"x0": "ab"}
    for i in range(1, 31):
        raw[f"x{i}"] = f"${{x{i - 1}}}${{x{i - 1}}}"
    began = time.monotonic()
    with pytest.raises(ConfigError, match=r"config key 'x19': its value resolves to more than 1,000,000 characters"):
        resolve_interpolations(raw)
    assert time.monotonic() - began < 20  # ms here; doubling without memo never ends at depth 30 (a busy CI: < 2 s)
    lists: dict[str, Any] = {"x0": ["a"]}  # a list doubled: its entries, not only its text, are bounded
    for i in range(1, 31):
        lists[f"x{i}"] = [f"${{x{i - 1}}}", f"${{x{i - 1}}}"]
    with pytest.raises(ConfigError, match=r"config key 'x1\d\.0': its value resolves to more than"):
        resolve_interpolations(lists)
    assert time.monotonic() - began < 20  # ms here; doubling without memo never ends at depth 30 (a busy CI: < 2 s)
    del raw["x30"], raw["x29"], raw["x28"], raw["x27"], raw["x26"], raw["x25"], raw["x24"], raw["x23"]
    del raw["x22"], raw["x21"], raw["x20"], raw["x19"]
    assert len(resolve_interpolations(raw)["x18"]) == 2**19  # under the bound: resolved, once per key


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"a": "run-${b", "b": 1}, r"config key 'a': 'run-\$\{b' has a `\$\{` without its `\}`"),
        ({"a": "x\\${b}", "b": 1}, r"config key 'a': .* leaves `\$\{` unresolved"),
        ({"a": "${b}", "b": "\\${c}", "c": 1}, r"config key 'b': .* leaves `\$\{` unresolved"),
        ({"a": "${x.${k}}", "x": {"q": 1}, "k": "z"}, r"config key 'a': \$\{x\.z\} names no key"),
        ({"a": "${x.${a}}", "x": {}}, r"interpolation cycle a -> a$"),
        ({"a": "${" * 500 + "}" * 500}, r"config key 'a': references nested more than 100 deep"),
        ({f"k{i}": f"${{k{i + 1}}}" for i in range(500)} | {"k500": 1}, r"a chain of more than 100 references"),
    ],
)
def test_hostile_interpolations_are_refused_by_key(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_interpolations(raw)


def test_doubling_interpolations_in_a_file_are_refused_by_key_fast(tmp_path: Path) -> None:
    lines = "".join(f'x{i}: "${{x{i - 1}}}${{x{i - 1}}}"\n' for i in range(1, 31))
    began = time.monotonic()
    with pytest.raises(ConfigError, match=r"config key 'x19': its value resolves to more than"):
        load_config(olmo_file(tmp_path, shaped() + 'x0: "ab"\n' + lines))
    assert time.monotonic() - began < 20  # ms here; doubling without memo never ends at depth 30 (a busy CI: < 2 s)


def test_a_cycle_in_a_file_is_refused_by_name(tmp_path: Path) -> None:
    text = shaped(device_train_microbatch_size="${device_eval_batch_size}")
    with pytest.raises(
        ConfigError,
        match=r"cycle device_train_microbatch_size -> device_eval_batch_size -> device_train_microbatch_size",
    ):
        load_config(olmo_file(tmp_path, text))


def test_yaml_1_1_strings_become_numbers_where_the_field_is_numeric(tmp_path: Path) -> None:
    text = OLMO2_7B_SHAPED.replace("max_duration: 1ep", "max_duration: 5e12T").replace(
        "t_warmup: 8388608000", "t_warmup: 1e3"
    )
    raw = yaml.safe_load(text)
    assert [raw["auxiliary_loss_multiplier"], raw["scheduler"]["t_max"], raw["model"]["layer_norm_eps"]] == [
        "1e-5",
        "5e12",
        "1e-6",
    ]  # what PyYAML (YAML 1.1) hands over
    cfg = load_config(olmo_file(tmp_path, text))
    assert cfg.z_loss_multiplier == 1e-5 and cfg.model.layer_norm_eps == 1e-6 and cfg.optimizer.eps == 1e-8
    assert cfg.scheduler.t_max == 5_000_000_000_000 and isinstance(cfg.scheduler.t_max, int)
    assert cfg.scheduler.t_warmup == 1000 and isinstance(cfg.scheduler.t_warmup, int)
    assert cfg.max_duration == "5e12T"
    with pytest.raises(ConfigError, match=r"config key 'scheduler\.t_max': got '5\.5e0', expected int"):
        load_config(olmo_file(tmp_path, shaped(scheduler__t_max="5.5e0")))


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "alibi": ({"model__alibi": True}, r"model\.alibi is true; only false can be trained \(positions are RoPE"),
    "no-rope": ({"model__rope": None}, r"model\.rope is false \(OLMo's default: the key is absent\); only true"),
    "bias": ({"model__include_bias": True}, r"model\.include_bias is true; only false can be trained"),
    "norm-bias": ({"model__bias_for_layer_norm": True}, r"model\.bias_for_layer_norm is true; only null or false"),
    "llama": ({"model__block_type": "llama"}, r"model\.block_type is \"llama\"; only \"sequential\" can be trained"),
    "gelu": ({"model__activation_type": "gelu"}, r"model\.activation_type is \"gelu\"; only \"swiglu\""),
    "clip": ({"model__clip_qkv": 8.0}, r"model\.clip_qkv is 8\.0; only null can be trained"),
    "mqa-conflict": ({"model__n_kv_heads": 4, "model__multi_query_attention": True}, r"model\.n_kv_heads is 4 with"),
    "scale-logits": ({"model__scale_logits": True}, r"model\.scale_logits is true; only false"),
    "emb-norm": ({"model__embedding_layer_norm": True}, r"model\.embedding_layer_norm is true; only false"),
    "norm-kind": ({"model__layer_norm_type": "amd_compatible"}, r"model\.layer_norm_type is \"amd_compatible\""),
    "dropout": ({"model__attention_dropout": 0.1}, r"model\.attention_dropout is 0\.1; only 0\.0 or 0 can be trained"),
    "default-dropout": ({"model__residual_dropout": None}, r"model\.residual_dropout is 0\.1 \(OLMo's default"),
    "init": ({"model__init_fn": "mitchell"}, r"model\.init_fn is \"mitchell\"; only \"normal\" can be trained"),
    "no-cutoff": ({"model__init_cutoff_factor": None}, r"model\.init_cutoff_factor is null \(OLMo's default"),
    "emb-init": ({"model__emb_init_std": 0.01}, r"model\.emb_init_std is 0\.01; only null"),
    "qk-affine": ({"model__attention_layer_norm_with_affine": False}, r"attention_layer_norm_with_affine is false"),
    "moe-key": ({"model__moe_num_experts": 8}, r"unknown config key 'model\.moe_num_experts'"),
    "lionw": ({"optimizer__name": None}, r"optimizer\.name is \"lionw\" \(OLMo's default: the key is absent\)"),
    "schedule": ({"scheduler__name": "inverse_sqrt_with_warmup"}, r"scheduler\.name is \"inverse_sqrt_with_warmup\""),
    "clip-warmup": ({"scheduler__grad_clip_warmup_steps": 100}, r"scheduler\.grad_clip_warmup_steps is 100; only null"),
    "norm-ratio": ({"max_grad_norm_ratio": 1.0}, r": max_grad_norm_ratio is 1\.0; only null is supported here"),
    "data-seed": ({"data__seed": 1}, r"data\.seed is 1, not the run's seed 6198"),
    "two-dtypes": ({"data__dtype": "uint16"}, r"config keys 'data\.\w+' and 'data\.\w+' both set 'data\.dtype'"),
    "fp16": ({"precision": "amp_fp16"}, r"config key 'precision': got 'amp_fp16', expected one of"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_this_trainer_cannot_honour_is_refused_by_key(case: str, tmp_path: Path) -> None:
    changes, match = REFUSED[case]
    with pytest.raises(ConfigError, match=match) as e:
        load_config(olmo_file(tmp_path, shaped(**changes)))
    assert "\n" not in str(e.value)


# what only training refuses: the data tools read the run's data whatever these say (issue 41)
DATA_SIDE_REFUSED = ("moe-key", "data-seed", "two-dtypes", "fp16")


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_data_tools_read_what_only_training_refuses(case: str, tmp_path: Path) -> None:
    changes, match = REFUSED[case]
    path = olmo_file(tmp_path, shaped(**changes))
    if case in DATA_SIDE_REFUSED:  # these change the run's data, or are not OLMo's at all: refused alike
        with pytest.raises(ConfigError, match=match):
            read_run_config(str(path))
        return
    cfg = read_run_config(str(path))
    assert (cfg.model.max_sequence_length, cfg.model.vocab_size) == (4096, 100278)
    assert cfg.global_train_batch_size == load_config(olmo_file(tmp_path, shaped())).global_train_batch_size


def test_multi_query_attention_is_one_kv_head(tmp_path: Path) -> None:
    assert load_config(olmo_file(tmp_path, shaped(model__multi_query_attention=True))).model.n_kv_heads == 1


def test_the_form_is_told_by_olmo_only_keys(tmp_path: Path) -> None:
    assert olmo_form_key(yaml.safe_load(OLMO2_7B_SHAPED)) == "dry_run"
    assert olmo_form_key({"model": {"rope": True}, "data": {"paths": ["a"]}}) == "model.rope"
    assert olmo_form_key({"data": {"memmap_dtype": "uint16"}}) == "data.memmap_dtype"
    ours = {"model": {"d_model": 64, "n_heads": 4, "mlp_hidden_size": 256}, "data": {"paths": ["a.npy"]}}
    assert olmo_form_key(ours) is None
    path = tmp_path / "ours.yaml"
    path.write_text(yaml.safe_dump(ours))
    assert load_config(path).model.mlp_hidden_size == 256  # ours is not halved
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.d_modle'; did you mean 'model\.d_model'\?"):
        load_config(olmo_file(tmp_path, shaped(model__d_modle=64)))
