"""The S3 write path of ``stage``: PUTs through obstore (Rust ``object_store``), not botocore.

Why (measured 2026-12-02 on this project's 2-core machine, Ceph 16.2 RGW of tests/ceph, load
average 0.0-0.6; 2,000 files of 4-60 KiB, 16 concurrent requests, one process): boto3
``put_object`` with Content-MD5 reached 872 files/s at 0.98 ms of client CPU per file (Python:
request building, event hooks, SigV4, urllib3; one core under the GIL); obstore 0.12.1 ``put``
from 16 threads 2,100 files/s at 0.13 ms, its ``put_async`` on one asyncio loop 1,900 files/s
at 0.18 ms. The request is built, signed and sent in Rust with the GIL released, so threads
overlap and the per-file CPU is a seventh. obstore is therefore the write path; the threads
stay (they are cheaper than the event loop). ``awscrt`` was not measured.

What each request carries, and the one hash:

- ``stage`` reads each file once before any write and computes sha256 (manifest, content
  address); below the multipart threshold it keeps the bytes (up to ``core.KEEP_BYTES`` in all)
  and the md5 of those same bytes is computed in the upload threads, beside the store's work (past
  the budget: md5 with the sha256, and the file read again for its PUT). Nothing hashes the body again:
  requests are signed with ``UNSIGNED-PAYLOAD`` (SigV4 would otherwise hash every body) and no
  checksum header is computed (``object_store``'s ``checksum_algorithm`` would hash it in Rust).
- The store's own check of each PUT: obstore cannot send a per-request Content-MD5 (its client
  headers are fixed per store), and the Ceph RGW here (16.2) ignores ``x-amz-checksum-sha256``
  and even a wrong signed ``x-amz-content-sha256`` (both accepted with a wrong value, tested
  2026-12-02). What RGW, MinIO and S3 without SSE-KMS/SSE-C do give is the ETag of a single PUT:
  the md5 the store computed over the bytes it stored. ``S3Target.put`` compares it with the md5
  of the read before the write; where it differs (the file changed after it was hashed, or an
  ETag that is no MD5: field case C14) the object is PUT again through boto3 with Content-MD5, so
  the store itself checks the body: refused, the object is deleted and the write fails; accepted,
  the store is a C14 store and its later PUTs go through boto3 with Content-MD5 directly.
- User metadata ``sha256`` and ``label`` are obstore ``attributes`` (keys that are no standard
  header become ``x-amz-meta-*``; checked on RGW with a boto3 HEAD).

Large files (>= 8 MiB) are sent in parts by obstore from the file (read in Rust), part size and
part concurrency from the file size (:func:`part_plan`). Their sha256 is still computed before the
first part goes, because the object's key holds the dataset's content address (the digest of
every file's sha256): the key is not known before every file is hashed. The alternatives were
measured (3 files of 256 MiB, same machine and date): the sha256 pre-pass takes 0.24 s for the
three (3.3 GB/s on 2 threads, hashlib releases the GIL) against 1.25-1.45 s for their upload
(560-640 MB/s); uploading to a temporary key while hashing and then copying into place (an RGW
CopyObject of 256 MiB with new metadata took 0.04 s: RGW copies by reference) could save at most
~0.2 s of 1.5 s, at the price of temporary objects that a SIGKILL leaves outside the prefix and a
second request per file. The pre-pass stays; verification stays a HEAD of size + ``sha256``.

A multipart upload that fails is aborted (its unfinished uploads of that key, found by a listing:
obstore does not abort them itself); one that a SIGKILL interrupts leaves its parts until the
store's lifecycle rule or an operator removes them, as with any S3 client.

Retries: single PUTs are retried here (up to :data:`ATTEMPTS` in all, exponential backoff with
jitter, on 5xx, throttling, resets and timeouts), so stage can report how many it retried; a
multipart upload's parts are retried inside ``object_store`` (5 retries, not counted). A failure
that stays is raised as :class:`StoreUnavailable` (a ConnectionError: exit 75, transient).
"""

from __future__ import annotations

from pipectl.components.objstore import (  # noqa: F401 - re-exported: stage's writer
    ATTEMPTS,
    MiB,
    ObjectWriter,
    StoreUnavailable,
    is_transient,
    part_plan,
)
