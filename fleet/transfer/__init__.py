"""Files between the bastion and the nodes: `fleet push` / `fleet pull`, and the API under them.

Transport, chosen by measuring (docs/benchmark.md, "Push and pull"): a raw byte stream per file,
carrying nothing but the file's bytes (no tar: no member headers a node could forge); names come
from a NUL-separated `find -printf` listing, checked by fleet.transfer.paths before anything is
written. fleet connects, authenticates and judges the host key with its own SSH session
(fleet.ssh.transport), which lists, probes and hashes; the file bytes then go through the
OpenSSH client binary (fleet.ssh.openssh, fleet.transfer.pipe): one master connection per host,
pinned to exactly the host key fleet verified, and one multiplexed `ssh` per file. paramiko
decrypting in Python moved ~450 MB/s with a core saturated where ssh with AES-GCM moved 1.1 GB/s;
paramiko's SFTP with prefetch moved 6 MB/s. Where ssh cannot do what fleet resolved (no binary,
ProxyJump, ProxyCommand, algorithm lists, a host certificate, a value ssh would expand) or its
master does not start, the stream runs on an exec channel of fleet's session instead; events and
the run record say which (`via`). A push sends files below Options.together_below in batches, one
node command per batch on fleet's session (fleet.transfer.putmany): the node's python3 skips,
writes, verifies and commits each file as the sh commands would, names and digests on stdin.
A pull of a tree fetches them the same way (fleet.transfer.getmany): the node's python3 reads
each as the sh read command does (no symlink followed, the tree's real path kept, the file's
stamp compared before and after) and sends it framed with its sha256, names on stdin; the
bastion lands each as a file pulled alone. Without python3 on the node, that host's small
files move one by one.

Every file is:
- atomic: written under a `.fleet-part-<hash of name>` beside its final name, fsynced, renamed,
  its directory fsynced;
- verified: sha256 computed on the node (openssl where installed, else sha256sum: a second
  reader, while the file is sent; its size, mtime and ctime compared before and after, so a file
  that changes while it is sent fails) and on the bastion over the bytes received, in the
  process that writes them; a mismatch is a failure. A push is hashed by the bastion as it is
  sent, its digest sent after the bytes, and checked on the node (size, then sha256) before the
  rename;
- resumable: a file whose sha256 already matches is skipped; a part file is continued;
- bounded: per host one 1 MiB read and either one channel window (<= 8 MiB, shared out of 32
  MiB across the hosts) or two 1 MiB pipes to ssh, whatever the file size.

API (other code: checkpoints, consolidate). A `Connection` is a connected
fleet.ssh.transport.SSHSession (SSHTransport.connect(host)); every function returns results, raises
only ConnectFailed (the connection itself failed) or Cancelled (opts.cancel was set):

    files.list_remote(conn, remote) -> list[node.Entry]          # kind, size, rel (bytes)
    files.remote_sha256(conn, path) -> str                       # TransferError if not a file
    files.pull_tree(conn, remote, dest_dir, opts) -> Iterator[FileResult]
        # REMOTE (file or tree) into dest_dir/<name of REMOTE>, nothing outside dest_dir
    files.pull_file(conn, tree, rel, size, dir_fd, name, opts) -> FileResult
    files.push_file(conn, local_path, remote_path, opts) -> FileResult   # a regular file only
    files.push_tree(conn, files.walk_local(local), remote, opts) -> Iterator[FileResult]
        # each file read only through what the walk listed (fleet.transfer.local.open_listed)
    files.relay_file(src_conn, src_path, dst_conn, dst_path, opts) -> FileResult
        # node -> bastion -> node, never on the bastion's disk, verified on both nodes

`files.Options(limiter=ratelimit.Limiter([Bucket(rate)]), cancel=Event(), dry_run=False,
on_bytes=callback, route=pipe.open_route(conn, cancel)[0])` (route None: paramiko; close it
when done); `FileResult(rel, action, size, moved_bytes, sha256, error)` with `action` one of
copied, resumed, skipped, failed, refused (a node symlink or unsafe name, never followed or
written). fleet.transfer.fanout runs push/pull on many hosts with events and reporters.
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
