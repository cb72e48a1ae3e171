"""Files between the bastion and the nodes: `fleet push` / `fleet pull`, and the API under them.

Transport, chosen by measuring (docs/benchmark.md, "Push and pull"): a raw byte stream over an
exec channel of the SSH session fleet already holds (fleet.ssh.transport), one channel per file.
paramiko's SFTP with prefetch moved 6 MB/s on the same link where the stream moved 200+ MB/s; a
second connection per large file (two halves at once) measured slower once the halves had to be
joined and hashed. The stream carries nothing but the file's bytes (no tar: no member headers a
node could forge); names come from a NUL-separated `find -printf` listing, checked by
fleet.transfer.paths before anything is written.

Every file is:
- atomic: written under a `.fleet-part-<hash of name>` beside its final name, fsynced, renamed,
  its directory fsynced;
- verified: sha256 computed on the node (a second reader, while the file is sent; its size,
  mtime and ctime compared before and after, so a file that changes while it is sent fails) and
  on the bastion over the bytes received; a mismatch is a failure. A push is checked on the node
  (size, then sha256 against the bastion's) before the rename;
- resumable: a file whose sha256 already matches is skipped; a part file is continued;
- bounded: one channel window (<= 8 MiB, shared out of 32 MiB across the hosts) and one 256 KiB
  read per host, whatever the file size.

API (other code: checkpoints, consolidate). A `Connection` is a connected
fleet.ssh.transport.SSHSession (SSHTransport.connect(host)); every function returns results, raises
only ConnectFailed (the connection itself failed) or Cancelled (opts.cancel was set):

    files.list_remote(conn, remote) -> list[node.Entry]          # kind, size, rel (bytes)
    files.remote_sha256(conn, path) -> str                       # TransferError if not a file
    files.pull_tree(conn, remote, dest_dir, opts) -> Iterator[FileResult]
        # REMOTE (file or tree) into dest_dir/<name of REMOTE>, nothing outside dest_dir
    files.pull_file(conn, tree, rel, size, dir_fd, name, opts) -> FileResult
    files.push_file(conn, local_path, remote_path, opts) -> FileResult
    files.push_tree(conn, files.walk_local(local), remote, opts) -> Iterator[FileResult]
    files.relay_file(src_conn, src_path, dst_conn, dst_path, opts) -> FileResult
        # node -> bastion -> node, never on the bastion's disk, verified on both nodes

`files.Options(limiter=ratelimit.Limiter([Bucket(rate)]), cancel=Event(), dry_run=False,
on_bytes=callback)`; `FileResult(rel, action, size, moved_bytes, sha256, error)` with `action`
one of copied, resumed, skipped, failed, refused (a node symlink or unsafe name, never followed
or written). fleet.transfer.fanout runs push/pull on many hosts with events and reporters.
"""

from fleet.transfer.files import (
    Action,
    FileResult,
    Options,
    TransferError,
    list_remote,
    pull_file,
    pull_tree,
    push_file,
    push_tree,
    relay_file,
    remote_sha256,
    walk_local,
)

__all__ = [
    "Action",
    "FileResult",
    "Options",
    "TransferError",
    "list_remote",
    "pull_file",
    "pull_tree",
    "push_file",
    "push_tree",
    "relay_file",
    "remote_sha256",
    "walk_local",
]
