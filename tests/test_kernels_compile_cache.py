"""``torch.compile``'s caches keyed on the kernels' op sources (``kernels/compile_cache.py``):
a new version of the ops' formulas is a cache miss, the same version a hit, a user's own
tag is kept, and only taking a module sets the tag."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from profilednn.kernels import compile_cache
from profilednn.kernels.compile_cache import (OP_SOURCES, TAG_PREFIX, kernels_digest, sources_digest,
                                              tag_compile_cache, with_kernels_tag)


@pytest.fixture
def restore_tag():
    before = torch.compiler.config.cache_key_tag
    yield
    torch.compiler.config.cache_key_tag = before


def test_digest_changes_with_any_op_source(tmp_path: Path) -> None:
    names = ("a.py", "b.py")
    for name in names:
        (tmp_path / name).write_text(f"# {name}\n")
    first = sources_digest(tmp_path, names)
    assert first == sources_digest(tmp_path, names) and len(first) == 16
    (tmp_path / "b.py").write_text("# b.py, a changed backward\n")
    assert sources_digest(tmp_path, names) != first
    src = Path(compile_cache.__file__).parent
    assert all((src / name).is_file() for name in OP_SOURCES)
    assert kernels_digest() == sources_digest(src, OP_SOURCES)


def test_tag_keeps_the_users_parts_and_replaces_an_older_digest() -> None:
    assert with_kernels_tag("", "d1") == TAG_PREFIX + "d1"
    assert with_kernels_tag("mine", "d1") == f"mine+{TAG_PREFIX}d1"
    assert with_kernels_tag(f"mine+{TAG_PREFIX}d0+other", "d1") == f"mine+other+{TAG_PREFIX}d1"
    assert with_kernels_tag(with_kernels_tag("mine", "d1"), "d1") == f"mine+{TAG_PREFIX}d1"


def test_creating_a_kernel_module_tags_the_cache_keys(restore_tag) -> None:  # noqa: ANN001
    from profilednn.kernels import AtenMaxPool2d, FusedBatchNorm2d, FusedDropout, PointwiseGemmConv2d

    expected = f"users-own+{TAG_PREFIX}{kernels_digest()}"
    makers = [lambda: AtenMaxPool2d(3, 2), lambda: FusedBatchNorm2d.from_batch_norm(nn.BatchNorm2d(4)),
              lambda: PointwiseGemmConv2d.from_conv(nn.Conv2d(4, 4, 1)), lambda: FusedDropout(0.1),
              lambda: copy.deepcopy(FusedDropout(0.1)), lambda: pickle.loads(pickle.dumps(AtenMaxPool2d(2)))]
    for make in makers:
        torch.compiler.config.cache_key_tag = "users-own"
        module = make()
        assert torch.compiler.config.cache_key_tag == expected, type(module).__name__
    torch.compiler.config.cache_key_tag = "users-own"
    nn.MaxPool2d(2), nn.BatchNorm2d(4)
    assert torch.compiler.config.cache_key_tag == "users-own"  # stock modules leave it alone
    assert tag_compile_cache() == expected


_CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    from torch import nn
    from torch._dynamo.utils import counters
    from profilednn.kernels import compile_cache
    compile_cache.kernels_digest = lambda: os.environ["FAKE_KERNELS_DIGEST"]  # what an upgrade changes
    from profilednn.kernels import keep_aten_pools
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.MaxPool2d(2))
    keep_aten_pools(model)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    torch.compile(model)(x).sum().backward()
    print(json.dumps({"hit": counters["aot_autograd"]["autograd_cache_hit"],
                      "miss": counters["aot_autograd"]["autograd_cache_miss"],
                      "tag": torch.compiler.config.cache_key_tag}))
""")


def _compile_in_child(cache_dir: Path, digest: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "FAKE_KERNELS_DIGEST": digest,
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "1", "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    env.pop("TORCH_COMPILE_CACHE_KEY_TAG", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_kernels_version_misses_the_compiled_backward_cache(tmp_path: Path) -> None:
    """Three processes over one cache directory: the same kernels hit the cache, a changed
    digest (an upgrade) compiles afresh instead of reusing the old backward."""
    pytest.importorskip("torch._inductor")
    first = _compile_in_child(tmp_path, "0000000000000001")
    assert first["miss"] >= 1 and first["hit"] == 0 and first["tag"] == TAG_PREFIX + "0000000000000001"
    again = _compile_in_child(tmp_path, "0000000000000001")
    assert again["hit"] >= 1 and again["miss"] == 0  # the cache works, so the next miss is the tag's doing
    upgraded = _compile_in_child(tmp_path, "0000000000000002")
    assert upgraded["miss"] >= 1 and upgraded["hit"] == 0
