"""Run by tests/convert/test_hf_olmo.py with the python of the ai2-olmo environment (scripts/ai2_olmo_env.sh),
never imported by the project: tiny random models built by ai2-olmo's own `hf_olmo` classes, saved by their own
`save_pretrained` (safetensors, or pytorch_model.bin), and their logits for fixed token ids, as the reference the
imports are compared with.

    python -I hf_olmo_reference.py CASES.json OUT_DIR

CASES.json: {"ids": [[...], ...], "cases": {NAME: {"config": {OLMo model keys}, "bin": bool}}}. Writes
OUT_DIR/NAME/ (the model directory) and OUT_DIR/NAME.npy (float32 logits, batch x seq x embedding rows) for
each case, and OUT_DIR/versions.json (what computed them).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from hf_olmo import OLMoConfig, OLMoForCausalLM
from olmo.version import VERSION


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every tensor random and of order 1, norm scales too (at init they are all 1, and a norm mapped to the
    wrong place would go unseen)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    ids = torch.tensor(spec["ids"], dtype=torch.long)
    torch.manual_seed(0)
    for seed, (name, case) in enumerate(sorted(spec["cases"].items())):
        config = OLMoConfig(init_device="cpu", **case["config"])
        model = OLMoForCausalLM(config, init_params=True).eval()
        randomize(model, seed)
        model.save_pretrained(str(out / name), safe_serialization=not case.get("bin", False))
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float().numpy()
        np.save(out / f"{name}.npy", logits)
    versions = {"ai2-olmo": VERSION, "transformers": transformers.__version__, "torch": torch.__version__}
    (out / "versions.json").write_text(json.dumps(versions))


if __name__ == "__main__":
    main()
