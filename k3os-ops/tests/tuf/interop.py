#!/usr/bin/env python3
"""python-tuf (the TUF reference implementation) on both sides of a channel, for
k3os-ops/tests/cli/tuf_interop.rs.

  interop.py client URL METADIR ROOT TARGET
      python-tuf's ngclient.Updater refreshes the channel at URL (METADIR keeps what it trusts
      between calls; ROOT is its starting root), then downloads TARGET and checks it against the
      targets metadata. Prints "ok" (exit 0) or "refused: <error>" (exit 3). Any other exit is
      a bug in the test.

  interop.py refresh URL METADIR ROOT
      python-tuf's ngclient.Updater refreshes the channel at URL only (METADIR as for client):
      what one poll of a channel costs the reference client. Prints "ok" or "refused: <error>"
      (exit 3).

  interop.py write REPO OP...
      Writes a channel with python-tuf's Metadata API, one OP after another:
        init:arch=A,threshold=T,v=N   root 1 (key root1), targets (keys targets1[,targets2] with
                                      threshold T) listing v1/manifest.json for arch A,
                                      snapshot and timestamp, all at version N
        rotate:role=R,key=K           root N+1 where role R's only key is K (threshold 1),
                                      signed by the old and the new root keys
        targets:v=N[,keys=K1+K2][,days=D]   re-sign targets as version N (by the role's keys,
                                      or by K1, K2), expiring in D days
        snapshot:v=N[,hashes=H1+H2][,days=D] snapshot N naming the current targets.json
        timestamp:v=N[,hashes=H1+H2][,days=D] timestamp N naming the current snapshot.json
        substitute-snapshot           another snapshot of the same version and length (its
                                      expiry one second later), signed by the snapshot key
      Keys are derived from their names (test keys, not secrets); the role → key names map is
      kept in REPO.keys.json, outside the served directory.
"""

import copy
import hashlib
import json
import os
import shutil
import sys
from datetime import datetime, timedelta, timezone

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api import exceptions
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer
from tuf.ngclient import Updater

ROLES = ["root", "targets", "snapshot", "timestamp"]
CLASSES = {"root": Root, "targets": Targets, "snapshot": Snapshot, "timestamp": Timestamp}


def signer(name):
    priv = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(name.encode()).digest())
    return CryptoSigner(priv, SSlibKey.from_crypto(priv.public_key()))


def expires(days):
    t = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=float(days))
    return t


class Repo:
    def __init__(self, path):
        self.path = path
        self.keyfile = path.rstrip("/") + ".keys.json"
        self.names = {}
        if os.path.exists(self.keyfile):
            with open(self.keyfile) as f:
                self.names = json.load(f)

    def save_names(self):
        with open(self.keyfile, "w") as f:
            json.dump(self.names, f)

    def load(self, role):
        return Metadata.from_file(os.path.join(self.path, f"{role}.json"))

    def bytes_of(self, role):
        with open(os.path.join(self.path, f"{role}.json"), "rb") as f:
            return f.read()

    def write(self, role, md, signers):
        md.signatures.clear()
        for s in signers:
            md.sign(s, append=True)
        data = md.to_bytes(JSONSerializer(compact=False))
        names = [f"{role}.json"]
        if role == "root":
            names.append(f"{md.signed.version}.root.json")
        for n in names:
            with open(os.path.join(self.path, n), "wb") as f:
                f.write(data)

    def signers(self, role):
        return [signer(n) for n in self.names[role]]

    def meta_file(self, role, version, hashes):
        data = self.bytes_of(role)
        algs = hashes.split("+") if hashes else ["sha256"]
        digests = {a: hashlib.new(a, data).hexdigest() for a in algs}
        return MetaFile(version=int(version), length=len(data), hashes=digests)


def op_init(repo, arch, threshold="1", v="1"):
    os.makedirs(os.path.join(repo.path, "v1"), exist_ok=True)
    threshold = int(threshold)
    repo.names = {
        "root": ["root1"],
        "targets": ["targets1", "targets2"][:threshold],
        "snapshot": ["snapshot1"],
        "timestamp": ["timestamp1"],
    }
    repo.save_names()
    root = Root(expires=expires(365), consistent_snapshot=False)
    for role in ROLES:
        for n in repo.names[role]:
            root.add_key(signer(n).public_key, role)
    root.roles["targets"].threshold = threshold
    repo.write("root", Metadata(root), repo.signers("root"))
    manifest = json.dumps({"version": "v1", "note": "written by python-tuf"}).encode()
    with open(os.path.join(repo.path, "v1", "manifest.json"), "wb") as f:
        f.write(manifest)
    target = TargetFile.from_data("v1/manifest.json", manifest, ["sha256"])
    target.unrecognized_fields["custom"] = {"version": "v1", "generation": 1, "arch": arch}
    targets = Targets(version=int(v), expires=expires(90), targets={target.path: target})
    repo.write("targets", Metadata(targets), repo.signers("targets"))
    op_snapshot(repo, v=v)
    op_timestamp(repo, v=v)


def op_rotate(repo, role, key):
    md = repo.load("root")
    old = repo.signers("root")
    root = md.signed
    for keyid in list(root.roles[role].keyids):
        root.revoke_key(keyid, role)
    root.add_key(signer(key).public_key, role)
    root.roles[role].threshold = 1
    root.version += 1
    repo.names[role] = [key]
    repo.save_names()
    new = repo.signers("root")
    signers = old + [s for s in new if s.public_key.keyid not in {o.public_key.keyid for o in old}]
    repo.write("root", md, signers)


def op_targets(repo, v, keys=None, days="90"):
    md = repo.load("targets")
    md.signed.version = int(v)
    md.signed.expires = expires(days)
    signers = [signer(k) for k in keys.split("+")] if keys else repo.signers("targets")
    repo.write("targets", md, signers)


def op_snapshot(repo, v, hashes=None, days="30"):
    current = repo.load("targets").signed.version
    snap = Snapshot(version=int(v), expires=expires(days))
    snap.meta["targets.json"] = repo.meta_file("targets", current, hashes)
    repo.write("snapshot", Metadata(snap), repo.signers("snapshot"))


def op_timestamp(repo, v, hashes=None, days="7"):
    current = repo.load("snapshot").signed.version
    ts = Timestamp(version=int(v), expires=expires(days))
    ts.snapshot_meta = repo.meta_file("snapshot", current, hashes)
    repo.write("timestamp", Metadata(ts), repo.signers("timestamp"))


def op_substitute_snapshot(repo):
    before = repo.bytes_of("snapshot")
    md = repo.load("snapshot")
    md.signed.expires = md.signed.expires + timedelta(seconds=1)
    repo.write("snapshot", md, repo.signers("snapshot"))
    after = repo.bytes_of("snapshot")
    assert len(after) == len(before) and after != before, "substitute keeps the length"


OPS = {
    "init": op_init,
    "rotate": op_rotate,
    "targets": op_targets,
    "snapshot": op_snapshot,
    "timestamp": op_timestamp,
    "substitute-snapshot": op_substitute_snapshot,
}


def write(path, ops):
    os.makedirs(path, exist_ok=True)
    repo = Repo(path)
    for op in ops:
        name, _, args = op.partition(":")
        kwargs = dict(a.split("=", 1) for a in args.split(",") if a)
        OPS[name](repo, **kwargs)


def updater(url, metadir, root):
    os.makedirs(metadir, exist_ok=True)
    if not os.path.exists(os.path.join(metadir, "root.json")):
        shutil.copy(root, os.path.join(metadir, "root.json"))
    downloads = os.path.join(metadir, "downloads")
    os.makedirs(downloads, exist_ok=True)
    return Updater(metadir, url, downloads, url, bootstrap=None), downloads


def refresh(url, metadir, root):
    try:
        up, _ = updater(url, metadir, root)
        up.refresh()
    except (exceptions.RepositoryError, exceptions.DownloadError) as e:
        print(f"refused: {type(e).__name__}: {e}")
        return 3
    print("ok")
    return 0


def client(url, metadir, root, target):
    try:
        up, downloads = updater(url, metadir, root)
        up.refresh()
        info = up.get_targetinfo(target)
        if info is None:
            print(f"refused: the targets name no {target}")
            return 3
        up.download_target(info, os.path.join(downloads, "target"))
    except (exceptions.RepositoryError, exceptions.DownloadError) as e:
        print(f"refused: {type(e).__name__}: {e}")
        return 3
    print("ok")
    return 0


def main(argv):
    if len(argv) >= 6 and argv[1] == "client":
        return client(*argv[2:6])
    if len(argv) >= 5 and argv[1] == "refresh":
        return refresh(*argv[2:5])
    if len(argv) >= 3 and argv[1] == "write":
        write(argv[2], argv[3:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
