"""Tiny timm ViT hosts shared by the tests (depth 4, dim 64, 32x32 input, 64 patches)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from tokenreduce import probes
from tokenreduce.core.registry import Registry
from tokenreduce.study import reading

TINY = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, num_classes=10)

#: The host matrix (README, "Tests"): each entry builds a tiny model of one timm ViT variant.
HOSTS = {
    "deit": lambda: VisionTransformer(**TINY),
    "distilled": lambda: VisionTransformerDistilled(**TINY),
    "registers": lambda: VisionTransformer(**TINY, reg_tokens=2),
    "layerscale": lambda: VisionTransformer(**TINY, init_values=0.1),
    "qknorm": lambda: VisionTransformer(**TINY, qk_norm=True),
    "avgpool": lambda: VisionTransformer(**TINY, class_token=False, global_pool="avg"),
    # timm's SigLIP: no class token, an attention-pool ('map') head over every token
    "siglip": lambda: VisionTransformer(**TINY, class_token=False, global_pool="map"),
}
#: The hosts of the matrix without a class token.
CLASS_TOKEN_FREE = frozenset({"avgpool", "siglip"})


#: Where the contract runs: the CPU, and CUDA (marked ``gpu``: the device script's tier) where torch sees one.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


#: The tests' own studies (register_study(name, TEST_STUDIES)): found by name while the tests run, never listed
#: with the built-in ones (list_studies(), the report)
TEST_STUDIES: Registry = Registry("study")
#: The tests' own experiments (register_experiment(name, TEST_EXPERIMENTS)), likewise never listed
TEST_EXPERIMENTS: Registry = Registry("experiment")


@pytest.fixture(scope="session", autouse=True)
def _test_registries() -> Iterator[None]:
    with reading(TEST_STUDIES), probes.reading(TEST_EXPERIMENTS):
        yield


def make_host(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return HOSTS[name]().eval()


@contextlib.contextmanager
def supplied(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Whatever the patched ``model``'s method needs from outside the model for a forward, as the method
    declares it: a reducer with an ``example_inputs()`` hook (a context that supplies them, e.g. the
    oracle's token priority) gets it entered; for every other method nothing happens."""
    from tokenreduce import Reducer

    with contextlib.ExitStack() as stack:
        for module in model.modules():
            hook = getattr(module, "example_inputs", None)
            if isinstance(module, Reducer) and callable(hook):
                stack.enter_context(hook())
        yield model


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


class Interrupted(Exception):
    """Raised by :func:`stop_at` to kill a training run at a given step (resume tests)."""


def stop_at(step: int):
    """An ``on_step`` hook for ``train``: raises Interrupted after optimizer step ``step``."""

    def hook(s: int) -> None:
        if s == step:
            raise Interrupted

    return hook


def default_sigint() -> None:
    """A child's ``preexec_fn``: Ctrl-C's default action even where this process ignores SIGINT (a test run
    started in the background by a non-interactive shell), so that Python installs its handler and the child
    can be stopped."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Wait for the state ``path`` announces (a run holding at its step, HOLD_ENV); fails if ``proc`` ends
    first. The deadline only keeps a broken run from hanging the session: nothing here depends on how fast
    the run is."""
    end = time.monotonic() + 600
    while not path.exists():
        assert proc.poll() is None, ("the run ended without holding", proc.communicate())
        assert time.monotonic() < end, f"no {path} after 600 s"
        time.sleep(0.05)
