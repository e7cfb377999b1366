"""verl 0.9.1's config keys and rlvr's status of each (docs/verl_compat.md, "Every key of verl's config").

    python scripts/verl_key_table.py extract DIR   # DIR: verl/trainer/config of the unpacked wheel
                                                   # (pip download verl==0.9.1 --no-deps; unzip)
    python scripts/verl_key_table.py table         # rewrite the table in docs/verl_compat.md

``extract`` keeps the dotted keys and default values of the two generated configs
(_generated_ppo_trainer.yaml, _generated_ppo_megatron_trainer.yaml) in
tests/trainer/config/verl_0_9_1_keys.json; ``table`` writes one row per key with rlvr's status
(rlvr.trainer.config.verl_keys.key_status). tests/trainer/config/test_verl_keys.py checks both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
KEYS_FILE = ROOT / "tests" / "trainer" / "config" / "verl_0_9_1_keys.json"
DOC = ROOT / "docs" / "verl_compat.md"
BEGIN, END = "<!-- verl-key-table: begin -->", "<!-- verl-key-table: end -->"
FILES = {"ppo_trainer": "_generated_ppo_trainer.yaml", "ppo_megatron_trainer": "_generated_ppo_megatron_trainer.yaml"}


def leaves(node: dict, prefix: str = "") -> dict:
    """Dotted leaf -> value (an empty dict is a leaf)."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def extract(config_dir: Path) -> None:
    data = {name: leaves(yaml.safe_load((config_dir / file).read_text())) for name, file in FILES.items()}
    KEYS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{KEYS_FILE}: {sum(len(v) for v in data.values())} keys")


def rows() -> list[tuple[str, str, str, str]]:
    """``(key, in which files, status, note)`` for every key of both files."""
    from rlvr.trainer.config.loader import schema_shape
    from rlvr.trainer.config.verl_keys import key_status

    data = json.loads(KEYS_FILE.read_text())
    shape = schema_shape()
    out = []
    for key in sorted(set(data["ppo_trainer"]) | set(data["ppo_megatron_trainer"])):
        where = " + ".join({"ppo_trainer": "fsdp", "ppo_megatron_trainer": "megatron"}[name] for name in FILES
                           if key in data[name])
        default = data["ppo_trainer"].get(key, data["ppo_megatron_trainer"].get(key))
        status = key_status(key, shape.helps, shape.defaults, default, shape.free_dicts)
        out.append((key, where, status.status if status else "UNKNOWN",
                    status.note if status else ""))
    return out


def table() -> str:
    lines = [BEGIN, "", "| verl key | config | status | what rlvr does |", "|---|---|---|---|"]
    for key, where, status, note in rows():
        lines.append(f"| `{key}` | {where} | {status} | {note.replace('|', '/')} |")
    return "\n".join([*lines, "", END])


def write_table() -> None:
    text = DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:start] + table() + text[stop:])


if __name__ == "__main__":
    if sys.argv[1:2] == ["extract"]:
        extract(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["table"]:
        write_table()
    else:
        sys.exit(__doc__)
