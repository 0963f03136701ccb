"""``ssd_tiny_fpn``: level shapes (square and non-square), parameter count, that the top-down path feeds the fine
levels, freezing, checkpoint round trip, ONNX parity, fitted default boxes."""

import onnxruntime as ort
import pytest
import torch
from torch import nn

from ssd import build_model, model_from_checkpoint, save_checkpoint
from ssd.errors import BackboneWeightsError
from ssd.export.onnx import export_onnx
from ssd.models.build import default_priors
from ssd.models.finetune import set_backbone_trainable
from ssd.priors.fit import fit_priors
from ssd.sizes import as_hw

NAME = "ssd_tiny_fpn"


def level_shapes(model: nn.Module, size) -> list[tuple[int, ...]]:
    with torch.no_grad():
        return [tuple(f.shape[1:]) for f in model.backbone(torch.zeros(1, 3, *as_hw(size)))]


@pytest.mark.parametrize("size, maps", [
    (256, [(32, 32), (16, 16), (8, 8), (4, 4), (2, 2)]),
    ("224x288", [(28, 36), (14, 18), (7, 9), (4, 5), (2, 3)]),  # height x width
    (300, [(38, 38), (19, 19), (10, 10), (5, 5), (3, 3)]),  # odd maps: the upsampling takes the lateral's size
])
def test_levels_and_outputs_per_size(size, maps):
    model = build_model(NAME, 4, image_size=size).eval()
    channels = [64, 64, 128, 128, 128]  # strides 8 and 16 fused at the neck's width
    assert level_shapes(model, size) == [(c, *m) for c, m in zip(channels, maps)]
    with torch.no_grad():
        loc, logits = model(torch.randn(2, 3, *as_hw(size)))
    boxes = sum(h * w * 4 for h, w in maps)
    assert model.priors.shape == (boxes, 4) and loc.shape == (2, boxes, 4) and logits.shape == (2, boxes, 5)
    assert torch.isfinite(loc).all() and torch.isfinite(logits).all()


def test_same_default_boxes_as_ssd_tiny():
    for size in (256, "224x288"):
        assert default_priors(NAME, size) == default_priors("ssd_tiny", size)


def test_parameter_count():
    def count(module):
        return sum(p.numel() for p in module.parameters())

    tiny, fpn = build_model("ssd_tiny", 7), build_model(NAME, 7)
    laterals = 64 * 64 + 4 * 128 * 64 + 5 * 2 * 64  # 1x1 convolutions (no bias) + BatchNorm weight and bias
    smooth = 2 * (64 * 64 * 9 + 2 * 64)  # 3x3 convolutions + BatchNorm
    assert count(fpn.backbone.neck) == laterals + smooth == 111_488
    assert count(fpn.backbone.body) == count(tiny.backbone) == 882_512
    head16 = (4 * 4 + 4 * 8) * 9 * 64  # the stride-16 head reads 64 channels instead of 128 (4 boxes, 7 + 1 classes)
    assert count(fpn) == count(tiny) + laterals + smooth - head16 == 1_215_424


def test_top_down_path_reaches_the_fine_levels():
    model = build_model(NAME, 2).eval()
    with torch.no_grad():
        levels = model.backbone.body(torch.randn(1, 3, 256, 256))
    levels = [f.requires_grad_() for f in levels]
    fused = model.backbone.neck(levels)
    loc, logits = model.heads[0](fused[0])  # stride 8
    (loc.sum() + logits.sum()).backward()
    assert all(f.grad is not None and f.grad.abs().sum() > 0 for f in levels)  # the coarsest level (stride 128) too
    assert all(fused[i] is levels[i] for i in (2, 3, 4))  # the coarse levels pass through

    with torch.no_grad():
        before = model.backbone(torch.ones(1, 3, 256, 256))
        model.backbone.neck.lateral[4][0].weight.zero_()  # cut the stride-128 lateral
        after = model.backbone(torch.ones(1, 3, 256, 256))
    assert not torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])
    assert all(torch.equal(before[i], after[i]) for i in (2, 3, 4))


def test_freezing_keeps_the_neck_trainable():
    model = build_model(NAME, 2).train()
    body = {id(p) for p in model.backbone.body.parameters()}
    assert set_backbone_trainable(model, False) == len(body)
    assert all(p.requires_grad == (id(p) not in body) for p in model.parameters())
    norms = [[m for m in part.modules() if isinstance(m, nn.BatchNorm2d)] for part in model.backbone.children()]
    assert [len(n) for n in norms] == [11, 7]  # body, neck
    assert not any(m.training for m in norms[0]) and all(m.training for m in norms[1])  # frozen statistics


def test_no_imagenet_backbone(tmp_path):
    path = tmp_path / "vgg16.pth"
    torch.save({"features.0.weight": torch.zeros(64, 3, 3, 3)}, path)
    with pytest.raises(BackboneWeightsError, match="ssd_tiny_fpn has no ImageNet backbone"):
        build_model(NAME, 2, backbone_weights=path)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = build_model(NAME, class_names=["fish", "shark"], image_size="96x128")
    with torch.no_grad():  # non-default BatchNorm statistics, so that the buffers round-trip too
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return net.eval()


def test_checkpoint_round_trip_gives_identical_outputs(model, tmp_path):
    restored = model_from_checkpoint(save_checkpoint(tmp_path / "fpn.pt", model))
    assert restored.config == model.config and restored.config.name == NAME
    x = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for ours, theirs in zip(model(x), restored.eval()(x)):
            assert torch.equal(ours, theirs)


def test_channels_last_gives_the_same_outputs(model):
    x = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(2))
    copy = build_model(NAME, class_names=model.class_names, image_size="96x128").eval()
    copy.load_state_dict(model.state_dict())
    copy.to(memory_format=torch.channels_last)
    with torch.no_grad():
        for ours, theirs in zip(model(x), copy(x.contiguous(memory_format=torch.channels_last))):
            torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_onnx_export_matches_pytorch(model, tmp_path):
    path = export_onnx(model, tmp_path / "fpn.onnx")  # the parity check through detect_batch runs inside too
    x = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        loc, logits = model(x)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got_loc, got_logits, priors = (torch.from_numpy(v) for v in session.run(None, {"images": x.numpy()}))
    torch.testing.assert_close(got_loc, loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_logits, logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(priors, model.priors)


def test_fitted_default_boxes_build_and_run():
    generator = torch.Generator().manual_seed(0)
    centres, sides = torch.rand(200, 2, generator=generator), torch.rand(200, 2, generator=generator) * 0.2 + 0.02
    boxes = torch.cat((centres - sides / 2, centres + sides / 2), 1).clamp(0, 1)
    fitted = fit_priors(boxes, "224x288", default_priors(NAME, "224x288")).priors
    model = build_model(NAME, 2, image_size="224x288", priors=fitted).eval()
    with torch.no_grad():
        loc, _ = model(torch.zeros(1, 3, 224, 288))
    assert model.config.priors == fitted and torch.equal(model.priors, fitted.boxes((224, 288)))
    assert loc.shape[1] == model.priors.shape[0] == 5396
