"""Bad datasets are refused before anything is written."""

import pytest

from pipectl.components.stage.core import DatasetError, scan_local, validate_source


def _jpeg(path):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(path, "JPEG")


def test_missing_path(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        scan_local(tmp_path / "nope")


def test_empty_dataset(tmp_path):
    (tmp_path / "cats").mkdir()
    with pytest.raises(DatasetError, match="is empty"):
        scan_local(tmp_path)


def test_images_without_labels(tmp_path):
    _jpeg(tmp_path / "a.jpg")
    _jpeg(tmp_path / "b.jpg")
    with pytest.raises(DatasetError, match="no label"):
        scan_local(tmp_path)


def test_single_label(tmp_path):
    _jpeg(tmp_path / "cat" / "a.jpg")
    with pytest.raises(DatasetError, match="single label"):
        scan_local(tmp_path)


def test_good_layout(tmp_path):
    _jpeg(tmp_path / "cat" / "a.jpg")
    _jpeg(tmp_path / "dog" / "b.JPG")
    (tmp_path / "dog" / "notes.txt").write_text("ignored")
    files = scan_local(tmp_path)
    assert [(f.key, f.label) for f in files] == [("cat/a.jpg", "cat"), ("dog/b.JPG", "dog")]
    assert validate_source(str(tmp_path)) == 2


def test_unknown_example():
    with pytest.raises(DatasetError, match="unknown example"):
        validate_source("example:imagenet")


def test_dataset_error_exits_2_at_the_cli_and_1_in_a_step():
    e = DatasetError("x")
    assert e.cli_exit == 2
    assert e.step_exit == 1


def test_symlinked_label_folders_are_followed_and_hidden_folders_ignored(tmp_path):
    ds = tmp_path / "ds"
    real = ds / ".store" / "dog"  # a link inside the dataset folder
    _jpeg(real / "b.jpg")
    _jpeg(ds / "cat" / "a.jpg")
    (ds / "dog").symlink_to(real, target_is_directory=True)
    _jpeg(ds / ".thumbs" / "t.jpg")
    assert [f.key for f in scan_local(ds)] == ["cat/a.jpg", "dog/b.jpg"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_symlinks_out_of_the_dataset_folder_are_refused(tmp_path, kind):
    """A link to a file or folder outside the dataset (here a stand-in for a pod's
    ServiceAccount token) is refused naming it; nothing is listed, so nothing is copied."""
    secret = tmp_path / "outside" / "token.jpg"
    _jpeg(secret)
    ds = tmp_path / "ds"
    _jpeg(ds / "cat" / "a.jpg")
    if kind == "file":
        (ds / "cat" / "b.jpg").symlink_to(secret)
    else:
        (ds / "dog").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(DatasetError, match="outside the dataset folder") as e:
        scan_local(ds)
    assert e.value.cli_exit == 2


def test_a_symlink_cycle_is_walked_once(tmp_path):
    ds = tmp_path / "ds"
    _jpeg(ds / "cat" / "a.jpg")
    _jpeg(ds / "dog" / "b.jpg")
    (ds / "cat" / "again").symlink_to(ds / "cat", target_is_directory=True)
    assert [f.key for f in scan_local(ds)] == ["cat/a.jpg", "dog/b.jpg"]


def test_C13_every_image_extension_torchvision_reads_is_staged_in_any_case(tmp_path):
    """C13: ImageFolder's extensions (torchvision IMG_EXTENSIONS) + .gif, upper or lower case; the
    name only selects files (preprocess reads the format from the bytes)."""
    names = ["a.jpg", "b.JPEG", "c.PNG", "d.webp", "e.TIF", "f.tiff", "g.bmp", "h.gif", "i.ppm", "j.pgm"]
    for n in names:
        (tmp_path / "x").mkdir(exist_ok=True)
        (tmp_path / "x" / n).write_bytes(b"bytes")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "k.Jpg").write_bytes(b"bytes")
    (tmp_path / "y" / "notes.txt").write_text("ignored")
    (tmp_path / "y" / "l.svg").write_text("<svg/>")
    assert sorted(f.key for f in scan_local(tmp_path)) == sorted([f"x/{n}" for n in names] + ["y/k.Jpg"])


def _manifest(tmp_path, rows, name="train.csv"):
    import csv

    path = tmp_path / name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: [r[i] for r in rows[1:]] for i, k in enumerate(rows[0])}), path)
    else:
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return path


@pytest.mark.parametrize("name", ["train.csv", "train.parquet"])
def test_a_manifest_of_uri_and_label_rows_is_a_dataset(tmp_path, name):
    from pipectl.components.stage.sources import scan_manifest

    for i in range(2):
        _jpeg(tmp_path / "images" / f"cat{i}.jpg")
        _jpeg(tmp_path / "more" / "nested" / f"dog{i}.jpg")
    rows = [["uri", "label"], ["images/cat0.jpg", "cat"], ["images/cat1.jpg", "cat"],
            ["more/nested/dog0.jpg", "dog"], ["./more/nested/dog1.jpg", "dog"]]
    files = scan_manifest(None, str(_manifest(tmp_path, rows, name)))
    assert [f.label for f in files] == ["cat", "cat", "dog", "dog"]
    assert all(f.key.startswith(f"{f.label}/") and f.key.endswith(".jpg") and f.key.count("/") == 1 for f in files)
    assert len({f.key for f in files}) == 4
    assert [f.path for f in files] == [str((tmp_path / p).resolve()) for p in
                                       ("images/cat0.jpg", "images/cat1.jpg", "more/nested/dog0.jpg", "more/nested/dog1.jpg")]
    assert validate_source(str(tmp_path / name)) == 4


@pytest.mark.parametrize("rows,message", [
    ([["file", "class"], ["a.jpg", "cat"]], "needs the columns uri (or path) and label; it has file, class"),
    ([["uri", "label"]], "has no rows"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["", "dog"]], "row 3: the uri is empty"),
    ([["uri", "label"], ["images/cat0.jpg", "a/b"]], "row 2: label 'a/b' cannot name a class folder"),
    ([["uri", "label"], ["images/cat0.jpg", ".hidden"]], "row 2: label '.hidden' cannot name a class folder"),
    ([["uri", "label"], ["notes.txt", "cat"]], "row 2: notes.txt is not an image file name"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["images/nope.jpg", "dog"]], "row 3: images/nope.jpg does not exist"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["../outside.jpg", "dog"]], "row 3: ../outside.jpg is outside the manifest's folder"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["/etc/hostname.jpg", "dog"]], "row 3: /etc/hostname.jpg is outside"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["images/cat0.jpg", "cat"]], "row 3: images/cat0.jpg with label cat is listed already (row 2)"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["images/cat1.jpg", "cat"]], "single label"),
    ([["uri", "label"], ["images/cat0.jpg", "cat"], ["s3://bucket/dog.jpg", "dog"]], "a local manifest lists s3:// images"),
])
def test_a_bad_manifest_is_refused_naming_the_row_before_anything_is_written(tmp_path, rows, message):
    data = tmp_path / "data"
    for i in range(2):
        _jpeg(data / "images" / f"cat{i}.jpg")
    _jpeg(tmp_path / "outside.jpg")
    with pytest.raises(DatasetError) as e:
        validate_source(str(_manifest(data, rows)))
    assert message in str(e.value)


def test_a_manifest_file_that_is_missing_or_not_a_table_is_refused(tmp_path):
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="is not a Parquet file"):
        validate_source(str(tmp_path / "broken.parquet"))
    with pytest.raises(DatasetError, match="dataset manifest .*nope.csv does not exist"):
        validate_source(str(tmp_path / "nope.csv"))


def test_the_example_manifest_is_the_same_dataset_as_the_example_folder(tmp_path):
    """`pipectl data example DIR` writes DIR/train.csv beside the images: the same images with the
    same labels, read either way."""
    from pipectl.components.data import write_example
    from pipectl.components.data.digits import write_manifest
    import hashlib
    from pipectl.components.stage.sources import scan_manifest

    n = write_example("digits", tmp_path)
    manifest = write_manifest(tmp_path)
    assert manifest == tmp_path / "train.csv" and manifest.read_text().startswith("uri,label\n")

    def images(files):
        return sorted((f.label, hashlib.sha256(open(f.path, "rb").read()).hexdigest()) for f in files)

    listed, folder = scan_manifest(None, str(manifest)), scan_local(tmp_path)
    assert len(listed) == len(folder) == n and images(listed) == images(folder)
    assert validate_source(str(manifest)) == n


def test_files_are_listed_in_the_order_of_their_path_parts_with_their_paths(tmp_path):
    """Labels whose names sort differently as strings and as paths ('a-b' < 'a/' as strings):
    the order is by label, then file name, as pathlib orders the paths."""
    for key in ("a-b/2.jpg", "a-b/1.jpg", "a/x.png", "a.b/y.JPG", "b/z.jpeg", "a/.hidden.jpg", "b/notes.txt"):
        (tmp_path / key).parent.mkdir(exist_ok=True)
        (tmp_path / key).write_bytes(key.encode())
    files = scan_local(tmp_path)
    assert [f.key for f in files] == ["a/x.png", "a-b/1.jpg", "a-b/2.jpg", "a.b/y.JPG", "b/z.jpeg"]
    assert [f.label for f in files] == ["a", "a-b", "a-b", "a.b", "b"]
    for f in files:
        assert f.path == str(tmp_path / f.key) and f.size == len(f.key)
        with f.open() as stream:
            assert stream.read() == f.key.encode()
