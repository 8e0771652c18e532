"""runtime/pathsafe.py: which names are accepted, and that no symlink is ever followed."""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

import pytest

from sandbox_workspace.runtime import pathsafe
from sandbox_workspace.runtime.pathsafe import NotFound, SafeRoot, UnsafePath, check_name

CAFE_NFC = unicodedata.normalize("NFC", "café")
CAFE_NFD = unicodedata.normalize("NFD", "café")


# -- check_name ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("report.csv", "report.csv", id="plain"),
        pytest.param("a", "a", id="one-char"),
        pytest.param("数据.csv", "数据.csv", id="cjk"),
        pytest.param("Ünïcødé—名前.txt", "Ünïcødé—名前.txt", id="mixed-unicode"),
        pytest.param(CAFE_NFC, CAFE_NFC, id="cafe-nfc"),
        pytest.param(CAFE_NFD, CAFE_NFC, id="cafe-nfd-becomes-nfc"),
        pytest.param(".env", ".env", id="dotfile"),
        pytest.param("...", "...", id="three-dots-is-a-name"),
        pytest.param("a..b", "a..b", id="inner-dot-dot"),
        pytest.param("my file (1).pdf", "my file (1).pdf", id="inner-spaces"),
        pytest.param("%2e%2e", "%2e%2e", id="percent-encoded-dots-are-literal"),
        pytest.param("a" * 255, "a" * 255, id="255-ascii-bytes"),
        pytest.param("数" * 85, "数" * 85, id="255-bytes-of-3-byte-chars"),
        pytest.param("😀" * 63 + "abc", "😀" * 63 + "abc", id="255-bytes-with-4-byte-chars"),
    ],
)
def test_check_name_accepts(name: str, expected: str) -> None:
    assert check_name(name) == expected


def test_check_name_nfc_and_nfd_spellings_map_to_the_same_name() -> None:
    assert CAFE_NFC != CAFE_NFD
    assert check_name(CAFE_NFC) == check_name(CAFE_NFD) == CAFE_NFC


def test_check_name_length_is_measured_after_nfc() -> None:
    # 127 × "é" is 254 bytes in NFC but 381 bytes in NFD; the NFC spelling decides.
    name = unicodedata.normalize("NFD", "é" * 127)
    assert len(name.encode()) > pathsafe.MAX_NAME_BYTES
    assert check_name(name) == "é" * 127


REFUSED = [
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("..", id="dot-dot"),
    pytest.param("a/b", id="slash"),
    pytest.param("/", id="slash-only"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("../x", id="traversal"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("..\\x", id="backslash-traversal"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("\x00", id="nul-only"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a\rb", id="carriage-return"),
    pytest.param("a\tb", id="tab"),
    pytest.param("\x1b[31mred", id="escape"),
    pytest.param("a\x7fb", id="del"),
    pytest.param("a\x85b", id="c1-next-line"),
    pytest.param("\u202egnp.exe", id="rtl-override"),
    pytest.param("a\u200db", id="zero-width-joiner"),
    pytest.param("a\u200bb", id="zero-width-space"),
    pytest.param("\ufeffa", id="byte-order-mark"),
    pytest.param("a\u00adb", id="soft-hyphen"),
    pytest.param("a\u00a0b", id="no-break-space"),
    pytest.param("a\u3000b", id="ideographic-space"),
    pytest.param("a\u2028b", id="line-separator"),
    pytest.param("a\u2029b", id="paragraph-separator"),
    pytest.param("\u2025", id="two-dot-leader-nfkc-dot-dot"),
    pytest.param("\u2024\u2024", id="one-dot-leaders-nfkc-dot-dot"),
    pytest.param("\u2024", id="one-dot-leader-nfkc-dot"),
    pytest.param("\uff0e\uff0e", id="fullwidth-stops-nfkc-dot-dot"),
    pytest.param(".\uff0e", id="mixed-stops-nfkc-dot-dot"),
    pytest.param("\ufe52\ufe52", id="small-stops-nfkc-dot-dot"),
    pytest.param("a\uff0fb", id="fullwidth-solidus"),
    pytest.param("\uff0e\uff0e\uff0fetc\uff0fpasswd", id="fullwidth-traversal"),
    pytest.param("a\uff3cb", id="fullwidth-reverse-solidus"),
    pytest.param(" leading", id="leading-space"),
    pytest.param("trailing ", id="trailing-space"),
    pytest.param(" ", id="space-only"),
    pytest.param("a" * 256, id="256-bytes"),
    pytest.param("数" * 86, id="86x3-bytes-258"),
    pytest.param("😀" * 64, id="64x4-bytes-256"),
    pytest.param("\ud800", id="lone-surrogate"),
]


@pytest.mark.parametrize("name", REFUSED)
def test_check_name_refuses(name: str) -> None:
    with pytest.raises(UnsafePath):
        check_name(name)


def test_check_name_refuses_non_strings() -> None:
    with pytest.raises(UnsafePath):
        check_name(None)  # type: ignore[arg-type]


def test_check_name_message_names_what_was_checked() -> None:
    with pytest.raises(UnsafePath, match=r"^conversation_id "):
        check_name("..", what="conversation_id")


def test_unsafe_path_is_a_value_error_and_not_found_a_file_not_found_error() -> None:
    assert issubclass(UnsafePath, ValueError)
    assert issubclass(NotFound, FileNotFoundError)


# -- split_relative -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        pytest.param("a", ["a"], id="one"),
        pytest.param(
            "c1/uploads/temparea/数据.csv", ["c1", "uploads", "temparea", "数据.csv"], id="deep"
        ),
        pytest.param(f"d/{CAFE_NFD}", ["d", CAFE_NFC], id="nfc-per-part"),
    ],
)
def test_split_relative_accepts(path: str, parts: list[str]) -> None:
    assert pathsafe.split_relative(path) == parts


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("", id="empty"),
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param("a/../b", id="dot-dot-part"),
        pytest.param("a/./b", id="dot-part"),
        pytest.param("a//b", id="empty-part"),
        pytest.param("a/", id="trailing-slash"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("a/b\x00", id="nul"),
    ],
)
def test_split_relative_refuses(path: str) -> None:
    with pytest.raises(UnsafePath):
        pathsafe.split_relative(path)


# -- SafeRoot -----------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the root holding a canary file that must never be touched."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("CANARY")
    return d


@pytest.fixture
def safe_root(tmp_path: Path):
    root = SafeRoot(tmp_path / "root")
    yield root
    root.close()


def _tree(path: Path) -> dict[str, str | None]:
    """Every entry beneath ``path`` (not following links) with file contents."""
    out: dict[str, str | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = str(p.relative_to(path))
            out[rel] = p.read_text() if p.is_file() and not p.is_symlink() else None
    return out


def test_safe_root_creates_and_reads_nested_files(safe_root: SafeRoot) -> None:
    with safe_root.directory(["c1", "uploads"], create=True) as fd:
        wfd = os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"hello")
        os.close(wfd)
    fd = safe_root.open_file(["c1", "uploads", "f.txt"])
    try:
        assert os.read(fd, 100) == b"hello"
    finally:
        os.close(fd)
    assert safe_root.exists_dir(["c1", "uploads"])
    assert not safe_root.exists_dir(["c1", "missing"])


@pytest.mark.parametrize(
    "link_at",
    [
        pytest.param(["a"], id="first-component"),
        pytest.param(["c1", "uploads"], id="nested-component"),
    ],
)
def test_symlink_directory_component_is_refused_and_not_followed(
    safe_root: SafeRoot, outside: Path, link_at: list[str]
) -> None:
    base = Path(safe_root.path)
    (base / Path(*link_at)).parent.mkdir(parents=True, exist_ok=True)
    (base / Path(*link_at)).symlink_to(outside, target_is_directory=True)
    before = _tree(outside)

    with pytest.raises(UnsafePath, match="symbolic link"):
        safe_root.open_file([*link_at, "secret.txt"])
    with pytest.raises(UnsafePath), safe_root.directory(link_at):
        pass
    # create=True must neither follow the link nor create anything inside its target.
    with pytest.raises(UnsafePath), safe_root.directory([*link_at, "new", "deeper"], create=True):
        pass
    assert safe_root.exists_dir(link_at) is False  # a symlink is not a directory here
    with pytest.raises(UnsafePath):
        safe_root.lstat([*link_at, "secret.txt"])

    assert _tree(outside) == before


def test_symlink_as_final_file_is_refused_by_open_file(safe_root: SafeRoot, outside: Path) -> None:
    base = Path(safe_root.path)
    (base / "d").mkdir()
    (base / "d" / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePath, match="symbolic link"):
        safe_root.open_file(["d", "link.txt"])


def test_dangling_symlink_as_final_file_is_refused(safe_root: SafeRoot, tmp_path: Path) -> None:
    (Path(safe_root.path) / "ghost").symlink_to(tmp_path / "does-not-exist")
    with pytest.raises(UnsafePath):
        safe_root.open_file(["ghost"])


def test_lstat_describes_a_symlink_not_its_target(safe_root: SafeRoot, outside: Path) -> None:
    (Path(safe_root.path) / "link").symlink_to(outside / "secret.txt")
    st = safe_root.lstat(["link"])
    assert stat.S_ISLNK(st.st_mode)


@pytest.mark.timeout(10)
def test_fifo_is_not_opened_and_does_not_hang(safe_root: SafeRoot) -> None:
    # Nobody ever opens the write end: a blocking open would wait forever, and the
    # timeout marker turns that into a failure.
    os.mkfifo(Path(safe_root.path) / "pipe")
    with pytest.raises(NotFound):
        safe_root.open_file(["pipe"])


def test_directory_named_like_the_file_is_not_found(safe_root: SafeRoot) -> None:
    (Path(safe_root.path) / "report.csv").mkdir()
    with pytest.raises(NotFound):
        safe_root.open_file(["report.csv"])


def test_regular_file_as_directory_component_is_not_found(safe_root: SafeRoot) -> None:
    (Path(safe_root.path) / "c1").write_text("not a dir")
    with pytest.raises(NotFound):
        safe_root.open_file(["c1", "x"])
    assert not safe_root.exists_dir(["c1"])


def test_missing_file_and_directory_are_not_found(safe_root: SafeRoot) -> None:
    with pytest.raises(NotFound):
        safe_root.open_file(["nope"])
    with pytest.raises(NotFound):
        safe_root.open_file(["no-dir", "nope"])
    with pytest.raises(NotFound):
        safe_root.lstat(["nope"])


# -- remove_tree --------------------------------------------------------------------------


def test_remove_tree_unlinks_symlinks_without_following_them(tmp_path: Path, outside: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "a" / "b").mkdir(parents=True)
    (victim / "a" / "b" / "f.txt").write_text("x")
    (victim / "a" / "to-outside-dir").symlink_to(outside, target_is_directory=True)
    (victim / "to-outside-file").symlink_to(outside / "secret.txt")
    (victim / "to-root").symlink_to("/", target_is_directory=True)
    before = _tree(outside)

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pathsafe.remove_tree(fd, "victim")
    finally:
        os.close(fd)

    assert not victim.exists() and not victim.is_symlink()
    assert _tree(outside) == before
    assert (outside / "secret.txt").read_text() == "CANARY"


def test_remove_tree_on_a_symlink_removes_only_the_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    before = _tree(outside)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pathsafe.remove_tree(fd, "link")
    finally:
        os.close(fd)
    assert not (tmp_path / "link").is_symlink()
    assert _tree(outside) == before


def test_remove_tree_on_a_missing_name_is_a_no_op(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("k")
    before = sorted(os.listdir(tmp_path))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pathsafe.remove_tree(fd, "missing")
        pathsafe.remove_tree(fd, "missing")
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == before
