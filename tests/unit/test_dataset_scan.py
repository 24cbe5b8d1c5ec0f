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
    real = tmp_path / "elsewhere" / "dog"
    _jpeg(real / "b.jpg")
    ds = tmp_path / "ds"
    _jpeg(ds / "cat" / "a.jpg")
    (ds / "dog").symlink_to(real, target_is_directory=True)
    _jpeg(ds / ".thumbs" / "t.jpg")
    assert [f.key for f in scan_local(ds)] == ["cat/a.jpg", "dog/b.jpg"]
