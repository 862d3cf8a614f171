"""The networks we export: the policy/value net's contract, and both networks loading a weights file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from inferop_export.networks.conv_net import PolicyValueNet, conv_net
from inferop_export.networks.inception_v3 import INCEPTION_CLASSES, INCEPTION_SIZE, build_inception_v3, inception_v3


class TestPolicyValueNet:
    @pytest.mark.parametrize(
        ("rows", "cols", "depth", "hidden", "moves"),
        [(8, 7, 2, 16, 7), (6, 5, 1, 4, 30), (1, 1, 3, 2, 1), (19, 19, 1, 3, 361)],
    )
    def test_shapes_and_a_distribution_over_moves(
        self, rows: int, cols: int, depth: int, hidden: int, moves: int
    ) -> None:
        torch.manual_seed(0)
        net = PolicyValueNet(rows=rows, cols=cols, depth=depth, hidden=hidden, moves=moves).eval()
        boards = torch.randint(-1, 2, (3, 1, rows, cols)).float()
        with torch.no_grad():
            policy, value = net(boards)
            features = net.torso(boards)
        assert policy.shape == (3, moves)
        assert value.shape == (3, 1)
        assert features.shape == (3, hidden, rows, cols)  # the padded torso keeps the board size
        assert torch.all(policy >= 0)
        torch.testing.assert_close(policy.sum(dim=1), torch.ones(3))

    def test_the_answer_depends_on_the_board(self) -> None:
        torch.manual_seed(0)
        net = PolicyValueNet(rows=4, cols=4, depth=2, hidden=8, moves=4).eval()
        with torch.no_grad():
            empty, full = net(torch.zeros(1, 1, 4, 4)), net(torch.ones(1, 1, 4, 4))
        assert not torch.equal(empty[0], full[0])

    def test_the_default_depth_still_tells_boards_apart(self) -> None:
        """Ten layers deep with PyTorch's default initialisation every board got the same policy to 1e-7."""
        module = conv_net().module
        boards = torch.randint(-1, 2, (64, 1, 8, 7), generator=torch.Generator().manual_seed(1)).float()
        with torch.no_grad():
            policy, value = module(boards)
        assert len(set(policy.argmax(dim=1).tolist())) >= 3
        assert float(policy.std(dim=0).mean()) > 1e-2 and float(value.std()) > 1e-2

    @pytest.mark.parametrize("flag", ["rows", "cols", "depth", "hidden", "moves"])
    @pytest.mark.parametrize("bad", [0, -3])
    def test_bad_size_names_the_flag(self, flag: str, bad: int) -> None:
        sizes = {"rows": 4, "cols": 4, "depth": 1, "hidden": 2, "moves": 3, flag: bad}
        with pytest.raises(ValueError, match=f"--{flag} must be >= 1, got {bad}"):
            PolicyValueNet(**sizes)


CONV_NET_SIZES = {"rows": 4, "cols": 4, "depth": 2, "hidden": 8, "moves": 4}


class TestConvNetWeights:
    """A trained board network goes through the same path as Inception V3: `--weights` of the same sizes."""

    def test_serves_the_file_s_tensors_and_names_it(self, tmp_path: Path) -> None:
        import hashlib

        torch.manual_seed(11)
        trained = PolicyValueNet(**CONV_NET_SIZES)
        path = tmp_path / "board.pth"
        torch.save(trained.state_dict(), path)
        network = conv_net(**CONV_NET_SIZES, seed=3, weights=path)  # another seed: unloaded weights would differ
        boards = torch.randint(-1, 2, (5, 1, 4, 4), generator=torch.Generator().manual_seed(2)).float()
        with torch.no_grad():
            want, got = trained.eval()(boards), network.module(boards)
        torch.testing.assert_close(got, want)
        assert network.weights == f"board.pth, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"

    def test_a_state_dict_of_other_sizes_names_the_flag_and_the_sizes(self, tmp_path: Path) -> None:
        path = tmp_path / "wide.pth"
        torch.save(PolicyValueNet(**{**CONV_NET_SIZES, "hidden": 16}).state_dict(), path)
        expected = re.escape(f"--weights {path} (not a state dict of the conv net of ")
        with pytest.raises(ValueError, match=expected) as error:
            conv_net(**CONV_NET_SIZES, weights=path)
        assert "--hidden 8" in str(error.value) and "size mismatch" in str(error.value)

    def test_a_missing_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=re.escape(f"--weights {tmp_path / 'none.pth'}: no such file")):
            conv_net(**CONV_NET_SIZES, weights=tmp_path / "none.pth")


@pytest.fixture(scope="module")
def weights_file(inception_network: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torchvision-layout state dict, as `torch.save(model.state_dict())` writes one."""
    path = tmp_path_factory.mktemp("weights") / "inception_v3.pth"
    torch.save(inception_network.module.state_dict(), path)
    return path


class TestBuildInceptionV3:
    def test_loads_the_exact_tensors_of_the_file(self, weights_file: Path) -> None:
        saved = torch.load(weights_file, weights_only=True)
        # Another seed, so weights that were not loaded would differ from the file's.
        model = build_inception_v3(weights=weights_file, seed=7)
        state = model.state_dict()
        assert set(state) == set(saved)
        different = [name for name, tensor in saved.items() if not torch.equal(state[name], tensor)]
        assert different == []
        # The file's recalibrated BatchNorm statistics, not the initial zeros.
        assert state["Conv2d_1a_3x3.bn.running_mean"].abs().sum() > 0

    def test_computes_what_the_saved_network_computes(self, weights_file: Path, inception_network: Any) -> None:
        image = torch.randn(1, 3, INCEPTION_SIZE, INCEPTION_SIZE, generator=torch.Generator().manual_seed(3))
        model = build_inception_v3(weights=weights_file, seed=7)
        assert not model.training
        with torch.no_grad():
            expected, actual = inception_network.module.eval()(image), model(image)
        assert actual.shape == (1, INCEPTION_CLASSES)
        torch.testing.assert_close(actual, expected)

    @pytest.mark.parametrize(
        ("content", "reason"),
        [
            (
                lambda: PolicyValueNet(rows=2, cols=2, depth=1, hidden=2, moves=2).state_dict(),
                "not a torchvision",
            ),
            (lambda: torch.zeros(3), "expected a state dict"),
            (lambda: {"fc.weight": torch.zeros(10, 2048), "fc.bias": torch.zeros(10)}, "not a torchvision"),
        ],
        ids=["another network", "a tensor", "ten classes"],
    )
    def test_wrong_state_dict_names_the_file(self, tmp_path: Path, content: Any, reason: str) -> None:
        path = tmp_path / "wrong.pth"
        torch.save(content(), path)
        with pytest.raises(ValueError, match=reason) as error:
            build_inception_v3(weights=path)
        assert f"--weights {path}" in str(error.value)

    def test_a_file_that_is_not_a_checkpoint_names_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.pth"
        path.write_text("these are not weights\n")
        with pytest.raises(ValueError, match=re.escape(f"--weights {path}: not a PyTorch checkpoint")):
            build_inception_v3(weights=path)


class TestNetworkWeights:
    """Each network says where its weights came from; export writes it into config.pbtxt."""

    def test_random_weights_name_their_seed(self, inception_network: Any) -> None:
        assert inception_network.weights == "random (seed 0)"
        assert conv_net(rows=4, cols=4, depth=1, hidden=2, moves=3, seed=5).weights == "random (seed 5)"

    def test_a_weights_file_is_named_with_its_digest(self, weights_file: Path) -> None:
        import hashlib

        network = inception_v3(weights=weights_file, seed=3)
        digest = hashlib.sha256(weights_file.read_bytes()).hexdigest()
        assert network.weights == f"inception_v3.pth, sha256 {digest[:16]}"
