"""What a directory watcher keeps of a listing between two looks, and the events from one
look to the next.

Contract: a ``Listing`` maps each path under the watched directory to its state (size and
modification time; ``(0, "")`` for a directory). ``Snapshot.of(listing)`` keeps of it
only what the next diff needs: per entry a 64-bit hash of its path and one of its state,
in two arrays (16 bytes an entry), and the paths ``\\0``-joined and zlib-compressed,
read back only to name what was removed. ``held_bytes`` is all it holds; a listing whose
snapshot would hold more than ``MAX_HELD_BYTES`` raises ``DirectoryTooLarge`` (nothing
is kept). ``changes(before, listing, base)`` answers envd's ``FilesystemEvent``s: a new
path is ``CREATE``, a gone one ``REMOVE``, a changed state ``WRITE`` (each kind sorted by
name, names relative to ``base``).

Why: a watcher keeps its last look for up to ``watchers.IDLE_SECONDS``, 8 per sandbox and
``admission.MAX_WATCHERS`` per API process. Kept as a dict of path → (size, time) it held
about 300 bytes an entry (1.5 MB for the largest listing a sandbox answers, 1 MiB of
JSON); a 10,000-entry directory is now ~0.2 MB. The compressed paths are bounded apart
(``MAX_HELD_BYTES``) since random names of a hostile tenant do not compress.

The hashes are Python's own (SipHash, keyed per process): two paths of one listing
share a hash with odds of about n²/2⁶⁵; a tenant who could make them collide would only
lose events of their own sandbox.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass

from sandbox_workspace.contract.errors import ApiError

Listing = dict[str, tuple[int, str]]

MAX_HELD_BYTES = 256 * 1024
# Paths as JSON gave them: lone surrogates (names not in UTF-8) survive the round trip.
_ENCODING = ("utf-8", "surrogatepass")


class DirectoryTooLarge(ApiError):
    status, code = 429, "directory_too_large"  # envd's resource_exhausted


@dataclass(frozen=True)
class Snapshot:
    paths: array  # hash of each path, in the listing's order
    states: array  # hash of each one's state, in the same order
    names: bytes  # the paths, "\0"-joined (no path holds a NUL), zlib-compressed

    @classmethod
    def of(cls, listing: Listing) -> Snapshot:
        names = zlib.compress("\0".join(listing).encode(*_ENCODING), 1)
        held = 16 * len(listing) + len(names)
        if held > MAX_HELD_BYTES:
            raise DirectoryTooLarge(
                f"the directory's listing is too large to watch ({len(listing)} entries, "
                f"{held // 1024} KiB to keep; at most {MAX_HELD_BYTES // 1024} KiB): watch "
                "a smaller directory, or not recursively"
            )
        return cls(array("q", map(hash, listing)), array("q", map(hash, listing.values())), names)

    def held_bytes(self) -> int:
        return len(self.paths) * self.paths.itemsize * 2 + len(self.names)

    def removed(self, hashes: set[int]) -> list[str]:
        """The paths of this snapshot whose hashes are among ``hashes``."""
        names = zlib.decompress(self.names).decode(*_ENCODING).split("\0")
        return [name for name, h in zip(names, self.paths, strict=False) if h in hashes]


EMPTY = Snapshot.of({})


def changes(before: Snapshot, after: Listing, base: str) -> list[dict]:
    """envd's ``FilesystemEvent``s from the look ``before`` to ``after``."""
    gone = dict(zip(before.paths, before.states, strict=True))  # this diff's only
    created, written = [], []
    for path, state in after.items():
        was = gone.pop(hash(path), None)
        if was is None:
            created.append(path)
        elif was != hash(state):
            written.append(path)
    removed = before.removed(set(gone)) if gone else []
    cut = len(base) + 1 if base else 0
    return [
        {"name": path[cut:], "type": f"EVENT_TYPE_{kind}"}
        for kind, paths in (("CREATE", created), ("REMOVE", removed), ("WRITE", written))
        for path in sorted(paths)
    ]
