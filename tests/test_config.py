"""Typed config loading: file then --key=value, unknown keys named with the closest valid one."""
from dataclasses import dataclass
from typing import Optional

import pytest

from nanorl.config import UserError, load_config


@dataclass
class Cfg:
    lr: float = 1e-3
    max_iters: int = 10
    wandb: bool = False
    out_dir: str = "out/x"
    target: Optional[float] = None


def test_file_then_overrides(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("# a config\nimport math\nlr = 3e-4\nmax_iters = 20\n_private = 1\n")
    cfg = load_config(Cfg, [str(f), "--max_iters=5", "--wandb=true", "--target=0.5"])
    assert cfg == Cfg(lr=3e-4, max_iters=5, wandb=True, target=0.5)
    assert load_config(Cfg, ["--lr=0", "--max_iters=1e3", "--target=None", "--wandb=0"]) == Cfg(lr=0.0, max_iters=1000)


def test_unknown_keys_name_the_closest(tmp_path):
    with pytest.raises(UserError, match=r"unknown config key 'max_iter' \(did you mean 'max_iters'\?\)"):
        load_config(Cfg, ["--max_iter=3"])
    f = tmp_path / "c.py"
    f.write_text("lrr = 1\n")
    with pytest.raises(UserError, match=r"c.py: unknown config key 'lrr' \(did you mean 'lr'\?\)"):
        load_config(Cfg, [str(f)])


@pytest.mark.parametrize("arg,msg", [("--max_iters=abc", "must be a int"), ("--wandb=maybe", "true or false"),
                                     ("--lr", "expected --key=value"), ("nope.py", "not found"),
                                     ("--max_iters=2.5", "must be a int")])
def test_bad_values(arg, msg):
    with pytest.raises(UserError, match=msg):
        load_config(Cfg, [arg])


def test_file_values_are_type_checked(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("max_iters = 'ten'\n")
    with pytest.raises(UserError, match="'max_iters' must be a int"):
        load_config(Cfg, [str(f)])
