"""Pure decision rules of the steps."""

import pytest

from pipectl.components.contracts import Decision
from pipectl.components.evaluate.core import decide, explain
from pipectl.components.preprocess.screen import is_corrupt
from pipectl.components.preprocess.split import in_validation
from pipectl.components.stage.core import dataset_digest
from pipectl.components.contracts import ManifestEntry


@pytest.mark.parametrize(
    "metric,threshold,champion,expected",
    [
        (0.97, 0.95, None, Decision.promote),   # first model above the bar
        (0.94, 0.95, None, Decision.keep),      # below the bar, even with no champion
        (0.97, 0.95, 0.96, Decision.promote),   # beats the champion
        (0.96, 0.95, 0.96, Decision.keep),      # a tie keeps the champion
        (0.95, 0.95, 0.99, Decision.keep),      # worse than the champion
    ],
)
def test_promotion_rule(metric, threshold, champion, expected):
    assert decide(metric, threshold, champion) is expected


@pytest.mark.parametrize(
    "metric,threshold,champion,challenger,expected",
    [
        (0.99, 0.95, 0.96, 0.90, Decision.keep),     # best on its own split, worse on the champion's
        (0.96, 0.95, 0.96, 0.97, Decision.promote),  # better on the champion's set
        (0.94, 0.95, 0.50, 0.99, Decision.keep),     # the threshold still holds on its own split
        (0.97, 0.95, 0.96, 0.96, Decision.keep),     # a tie on the champion's set keeps the champion
    ],
)
def test_the_champion_is_compared_on_the_set_it_was_scored_on(metric, threshold, champion, challenger, expected):
    assert decide(metric, threshold, champion, challenger) is expected


@pytest.mark.parametrize(
    "metric,threshold,champion,challenger,says",
    [
        (0.2727, 0.8, None, None, "accuracy 0.2727 is below the promotion threshold 0.800"),
        (0.97, 0.95, None, None, "accuracy 0.9700 reaches the threshold 0.950; no champion to beat"),
        (0.97, 0.95, 0.96, None, "accuracy 0.9700 beats the champion (version 3)'s 0.9600"),
        (0.96, 0.95, 0.96, None, "accuracy 0.9600 ties the champion (version 3): a tie keeps the champion"),
        (0.99, 0.95, 0.96, 0.90, "accuracy 0.9000 is below the champion (version 3)'s 0.9600"),  # on the champion's set
    ],
)
def test_the_decision_says_why(metric, threshold, champion, challenger, says):
    decision = decide(metric, threshold, champion, challenger)
    assert says in explain(decision, "accuracy", metric, threshold, champion, challenger, "3")


def test_a_champion_set_with_other_labels_or_images_is_incomparable():
    from pipectl.components.contracts import ShardIndex
    from pipectl.components.evaluate.champion import incomparable

    def index(labels: list[str], size: int = 28, channels: int = 3) -> ShardIndex:
        return ShardIndex(labels=labels, image_size=size, channels=channels, mean=[0.0], std=[1.0], train=[],
                          validation=["s3://b/v.npz"], train_count=0, validation_count=1)

    assert incomparable(index(["a", "b"]), index(["a", "b"])) == ""
    assert "labels [b, a] (2), the candidate's [a, b] (2)" in incomparable(index(["a", "b"]), index(["b", "a"]))
    many = [f"c{i}" for i in range(20)]
    assert ", …] (20)" in incomparable(index(many), index(many[:3]))
    assert "3x32x32 images, the candidate was trained on 3x28x28" in incomparable(index(["a"]), index(["a"], size=32))


def test_split_is_a_function_of_content_and_close_to_the_fraction():
    import hashlib

    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4000)]
    held_out = sum(in_validation(h, 0.2) for h in hashes) / len(hashes)
    assert 0.18 < held_out < 0.22
    assert [in_validation(h, 0.2) for h in hashes] == [in_validation(h, 0.2) for h in hashes]


def test_corrupt_detection(tmp_path):
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(buf, "JPEG")
    good = buf.getvalue()
    assert is_corrupt(good) is None
    assert "truncated" in is_corrupt(good[: len(good) // 2])
    assert is_corrupt(b"hello world") == "not an image: text (starts 'hello world')"
    assert is_corrupt(b"\xff\xd8" + b"\x00" * 50 + b"\xff\xd9") is not None


def test_C13_bytes_after_the_end_of_image_marker_are_not_corruption():
    """C13: a text-mode copy's CR LF after EOI, and the same kind found elsewhere (a LF, zero
    padding, a vendor trailer, a second image appended as MPO files do; a PNG with bytes after
    IEND): decoders accept them, so they are not corrupt. A JPEG cut before its EOI (baseline or
    progressive) still is."""
    import io

    from PIL import Image

    def encode(fmt, **kw):
        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (10, 200, 30)).save(buf, fmt, **kw)
        return buf.getvalue()

    jpeg, progressive, png = encode("JPEG"), encode("JPEG", progressive=True), encode("PNG")
    for tail in (b"\r\n", b"\n", b"\x00" * 512, b"SAMSUNG trailer " * 20, jpeg):
        for img in (jpeg, progressive):
            assert is_corrupt(img + tail) is None, tail[:16]
            Image.open(io.BytesIO(img + tail)).load()  # and PIL does decode it
    assert is_corrupt(png + b"\r\n") is None
    for img in (jpeg, progressive):
        assert "truncated" in is_corrupt(img[:-2])
    assert "truncated" in is_corrupt(progressive[: len(progressive) * 2 // 3])


def test_dataset_digest_ignores_order_and_sees_content():
    a = ManifestEntry(key="0/a.jpg", size=1, sha256="0" * 64, label="0")
    b = ManifestEntry(key="1/b.jpg", size=1, sha256="1" * 64, label="1")
    b2 = ManifestEntry(key="1/b.jpg", size=1, sha256="2" * 64, label="1")
    assert dataset_digest([a, b]) == dataset_digest([b, a])
    assert dataset_digest([a, b]) != dataset_digest([a, b2])
