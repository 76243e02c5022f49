"""The tasks beyond classify through the real service on the CPU default (a local Ray, the
four-stage Serve app, HTTP): a fixed filter (ONNX) whose PNG answers equal numpy's to a grey
level, a random U-Net at 256x256 answering 1280x720 JPEGs at their size, an FCN-style
segmentation on a ResNet-style backbone (torch), and a YOLO-style head whose boxes are known
exactly; their options, NMS, and the errors of each route."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from pipeline.imaging import Target, encode_jpeg, encode_png, fit
from tests.integration.helpers import BASE, cpu_config, deploy, png_header_claiming, undeploy
from tests.models import tasks as tm

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def app(ray_cluster, tmp_path_factory):
    d = tmp_path_factory.mktemp("task_models")
    onnx.save(tm.filter_onnx(64), str(d / "filter.onnx"))
    torch.jit.trace(tm.unet(), torch.zeros(1, 3, 256, 256)).save(str(d / "unet.pt"))
    torch.jit.trace(tm.fcn(), torch.zeros(1, 3, 64, 64)).save(str(d / "fcn.pt"))
    torch.jit.trace(tm.yolo_squares(), torch.zeros(1, 3, 64, 64)).save(str(d / "yolo.pt"))
    (d / "colours.txt").write_text("red\ngreen\n")
    size = lambda n: {"height": n, "width": n}  # noqa: E731
    models = [
        {"name": "digits", "arch": "digits"},
        # no task named: an output of the input's size and channels is an image (the resize
        # is then classify's default, a centre crop, unless the entry says otherwise)
        {"name": "filter", "engine": "onnx", "source": str(d / "filter.onnx"),
         "input": {"resize": "stretch"}},
        {"name": "unet", "engine": "torch", "source": str(d / "unet.pt"), "task": "image",
         "input": size(256)},
        {"name": "seg", "engine": "torch", "source": str(d / "fcn.pt"), "task": "segment",
         "input": size(64)},
        {"name": "yolo", "engine": "torch", "source": str(d / "yolo.pt"), "task": "detect",
         "labels": str(d / "colours.txt"),
         "input": {**size(64), "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}},
    ]  # fmt: skip
    executor = {"buckets": [1, 2, 4]}
    deploy(cpu_config(models=models, executor=executor), name="tasks")
    yield
    undeploy("tasks")


def post(route: str, body: bytes, ct: str = "image/png", accept: str | None = None, **q):
    headers = {"content-type": ct, **({"accept": accept} if accept else {})}
    return httpx.post(BASE + route, content=body, headers=headers, params=q, timeout=120)


def pixels(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.asarray(Image.open(io.BytesIO(r.content)))


def test_the_filter_answers_numpys_image_to_a_grey_level(app):
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    r = post("/v1/models/filter/image", encode_png(img))
    assert r.headers["content-type"] == "image/png"  # the input's own format
    assert r.headers["x-request-id"]  # (Serve's proxy puts it on every answer)
    assert int(r.headers["x-batch-size"]) >= 1 and "gpu;dur=" in r.headers["server-timing"]
    assert np.abs(pixels(r).astype(int) - tm.filter_reference(img)).max() <= 1
    # another size: the model's answer resized back to it (size=input, the default)
    big = np.random.default_rng(1).integers(0, 256, (80, 96, 3), dtype=np.uint8)
    want = fit(tm.filter_reference(fit(big, Target(64, 64, 3))), Target(80, 96, 3))
    got = pixels(post("/v1/models/filter/image", encode_png(big), accept="image/png"))
    assert got.shape == (80, 96, 3) and np.abs(got.astype(int) - want).max() <= 2
    assert pixels(post("/v1/models/filter/image", encode_png(big), size="model")).shape == (
        64,
        64,
        3,
    )
    r = post("/v1/models/filter/image", encode_png(img), accept="image/jpeg", quality="95")
    assert r.headers["content-type"] == "image/jpeg"
    assert np.abs(pixels(r).astype(int) - tm.filter_reference(img)).mean() < 3


def test_the_unet_answers_a_720p_jpeg_as_a_jpeg_of_its_size(app):
    rng = np.random.default_rng(2)
    frame = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    r = post("/v1/models/unet/image", encode_jpeg(frame), "image/jpeg")
    assert r.headers["content-type"] == "image/jpeg" and pixels(r).shape == (720, 1280, 3)
    x = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    mean, std = tm.IMAGENET_MEAN[:, None, None], tm.IMAGENET_STD[:, None, None]
    t = ((x.transpose(2, 0, 1) / 255 - mean) / std)[None].astype(np.float32)
    with torch.inference_mode():
        y = tm.unet()(torch.from_numpy(t))[0].numpy().astype(np.float64)
    want = np.clip(np.rint((y * std + mean) * 255), 0, 255).transpose(1, 2, 0)
    got = pixels(post("/v1/models/unet/image", encode_png(x)))
    assert np.abs(got.astype(int) - want).max() <= 1


def test_segmentation_answers_a_mask_at_the_inputs_size_or_its_areas(app):
    x = np.random.default_rng(3).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    mean, std = tm.IMAGENET_MEAN[:, None, None], tm.IMAGENET_STD[:, None, None]
    t = ((x.transpose(2, 0, 1) / 255 - mean) / std)[None].astype(np.float32)
    with torch.inference_mode():
        want = tm.fcn()(torch.from_numpy(t))[0].argmax(0).numpy()
    mask = pixels(post("/v1/models/seg/segment", encode_png(x)))
    assert mask.dtype == np.uint8 and mask.shape == (64, 64)
    assert (mask == want).mean() > 0.999
    wide = np.asarray(Image.fromarray(x).resize((128, 96)))
    assert pixels(post("/v1/models/seg/segment", encode_png(wide))).shape == (96, 128)
    r = post("/v1/models/seg/segment", encode_png(wide), format="json")
    assert r.status_code == 200, r.text
    areas = r.json()
    assert (areas["height"], areas["width"]) == (96, 128)
    assert sum(c["pixels"] for c in areas["classes"]) == 96 * 128


def test_detection_boxes_are_exact_in_the_inputs_pixels(app):
    img = tm.squares_image([(0, 0, "red"), (2, 3, "green")])
    big = np.asarray(Image.fromarray(img).resize((128, 128), Image.NEAREST))
    r = post("/v1/models/yolo/detect", encode_png(big))
    assert r.status_code == 200, r.text
    boxes = r.json()["boxes"]
    assert [(b["box"], b["label"]) for b in boxes] == [
        ([0.0, 0.0, 32.0, 32.0], "red"),
        ([96.0, 64.0, 128.0, 96.0], "green"),
    ]  # each square once: its less sure copy suppressed by NMS
    assert all(b["score"] > 0.99 for b in boxes)
    kept = post("/v1/models/yolo/detect", encode_png(big), iou_threshold="1").json()["boxes"]
    assert len(kept) == 4  # nothing overlaps by more than 1: the copies stay
    assert len(post("/v1/models/yolo/detect", encode_png(big), max_boxes="1").json()["boxes"]) == 1
    # at the model's own size; no NMS, but the less sure copies (0.9) under the threshold
    r = post("/v1/models/yolo/detect", encode_png(img), score_threshold="0.95", iou_threshold="1")
    assert [b["box"] for b in r.json()["boxes"]] == [[0, 0, 16, 16], [48, 32, 64, 48]]


def test_each_route_refuses_clearly(app):
    png = encode_png(np.zeros((64, 64, 3), np.uint8))
    r = post("/v1/models/filter/classify", png)
    assert r.status_code == 400 and r.json()["detail"]["route"] == "/v1/models/filter/image"
    r = post("/v1/models/digits/image", png)
    assert r.status_code == 400 and r.json()["detail"]["task"] == "classify"
    assert post("/v1/models/filter/image", png, accept="image/gif").status_code == 406
    assert post("/v1/models/filter/image", png, quality="0").status_code == 400
    assert post("/v1/models/seg/segment", png, format="bmp").status_code == 400
    assert post("/v1/models/yolo/detect", png, top_k="3").status_code == 400
    assert (
        post("/v1/models/yolo/detect", b"not an image", "application/octet-stream").status_code
        == 415
    )
    # an answer of 6000x6000 pixels resized back would hold ~1 GB: refused from the header
    r = post("/v1/models/filter/image", png_header_claiming(6000, 6000))
    assert r.status_code == 413 and r.json()["detail"]["hint"] == "size=model"
    models = {m["name"]: m["task"] for m in httpx.get(BASE + "/v1/models").json()["models"]}
    assert models == {
        "digits": "classify",
        "filter": "image",
        "unet": "image",
        "seg": "segment",
        "yolo": "detect",
    }


def test_v2_answers_a_task_models_encoded_view_in_bytes_outputs(app):
    import base64
    import json

    meta = httpx.get(BASE + "/v2/models/yolo_encoded", timeout=30).json()
    assert meta["outputs"] == [{"name": "boxes", "datatype": "BYTES", "shape": [-1, 1]}]
    one = tm.squares_image([(1, 1, "green")])
    two = tm.squares_image([(3, 0, "red")])
    images = [base64.b64encode(encode_png(x)).decode() for x in (one, two)]
    r = httpx.post(
        BASE + "/v2/models/yolo_encoded/infer",
        json={
            "inputs": [
                {"name": "image_bytes", "shape": [2, 1], "datatype": "BYTES", "data": images}
            ],
            "parameters": {"score_threshold": 0.5, "priority": 1},
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    got = [[b["box"] for b in json.loads(d)["boxes"]] for d in out["data"]]
    assert out["name"] == "boxes" and got == [[[16, 16, 32, 32]], [[0, 48, 16, 64]]]
    img = np.random.default_rng(4).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    r = httpx.post(
        BASE + "/v2/models/filter_encoded/infer",
        json={
            "inputs": [
                {
                    "name": "image_bytes",
                    "shape": [1, 1],
                    "datatype": "BYTES",
                    "data": [base64.b64encode(encode_jpeg(img)).decode()],
                }
            ],
            "parameters": {"accept": "image/png"},
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    png = base64.b64decode(r.json()["outputs"][0]["data"][0])
    assert png.startswith(b"\x89PNG") and pixels_of(png).shape == (64, 64, 3)
    # the model's own tensors, by the model's own name: its raw output
    x = np.zeros((1, 3, 64, 64), np.float32)
    r = httpx.post(
        BASE + "/v2/models/filter/infer",
        json={"inputs": [{"name": "x", "shape": [1, 3, 64, 64], "datatype": "FP32",
                          "data": x.ravel().tolist()}]},
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 3, 64, 64]


def pixels_of(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def test_grpc_answers_a_task_models_encoded_view_as_over_http(app):
    """The same view over Serve's gRPC proxy (one v2 core for both fronts): the boxes of two
    images as JSON BYTES rows, the options in the request's parameters; a filtered image as
    its own bytes (raw contents: no base64)."""
    import json

    import tritonclient.grpc as tg

    from tests.integration.helpers import GRPC_PORT

    c = tg.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    try:
        meta = c.get_model_metadata("yolo_encoded", as_json=True)
        assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("boxes", "BYTES")]
        pngs = [encode_png(tm.squares_image(s)) for s in ([(1, 1, "green")], [(3, 0, "red")])]
        x = tg.InferInput("image_bytes", [2, 1], "BYTES")
        x.set_data_from_numpy(np.array(pngs, dtype=object).reshape(2, 1))
        r = c.infer("yolo_encoded", [x], parameters={"score_threshold": 0.5})
        got = [[b["box"] for b in json.loads(row[0])["boxes"]] for row in r.as_numpy("boxes")]
        assert got == [[[16, 16, 32, 32]], [[0, 48, 16, 64]]]
        img = np.random.default_rng(4).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        x = tg.InferInput("image_bytes", [1, 1], "BYTES")
        x.set_data_from_numpy(np.array([encode_png(img)], dtype=object).reshape(1, 1))
        r = c.infer("filter_encoded", [x], parameters={"accept": "image/png"})
        png = r.as_numpy("image")[0, 0]
        assert png.startswith(b"\x89PNG")
        assert np.abs(pixels_of(png).astype(int) - tm.filter_reference(img)).max() <= 1
    finally:
        c.close()
