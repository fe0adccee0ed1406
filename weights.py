"""A weight version's life, from the trainer's master weights to a worker's accelerator, and the seam
every way of carrying it plugs into (`Transport`).

Four files hold the rest. versions.py is the version itself, wherever it travels: the manifest,
the chunks, the CRCs, a version as a file, and whether it is full or an adapter
(`versions.Manifest.is_adapter`); deltas.py, a version sent as its difference from the one before.
weights_zmq.py is today's transport: the trainer pushes chunks to
the param server, which stores them and tells each worker where to fetch them; workers fetch them
in a thread of their own and relay them to each other (wire.py carries its messages).
weights_fs.py is a second one: versions published as files into a directory that the workers
share (--weights-dir), for preemptible remote workers that share a filesystem but not a fast
network path to the param server. A new transport is one more file with one more subclass.

NOBODY SEES HALF A VERSION (invariant 4). Whatever the transport, a version becomes visible only
complete and checked: the param server adds it only when the commit's manifest lists exactly the
chunks it received and every tensor's CRC checks (weights_zmq.WeightStore.commit); until then, and
after a corrupt or abandoned push, the previous version is served. A worker's transport offers its
main thread only a version whose every byte checked (`Transport.newest`), and the main thread swaps
it in between batches, so every token of a batch is sampled with one version.

What happens to a version, step by step (in weights_zmq.py unless another file is named):

  step                                what happens                                  where
  ----------------------------------  --------------------------------------------  ---------------------------
  the trainer gathers it              cast to the model's dtype, one tensor at a    trainer.Trainer.do_push
                                      time, from a sharded trainer too              hf_io.iter_hf_tensors
  cut into chunks                     a tensor of >= chunk_bytes / 16 into views    versions.cut_chunks
                                      of its own, smaller ones packed together;
                                      every byte's CRC computed once
  pushed                              a PushChunk per chunk, PUSH_WINDOW in         push_weights
                                      flight, then PushCommit with the manifest
  a chunk reaches the param server    CRC-checked; a wrong CRC or index discards    WeightStore.receive_chunk
                                      the whole push; so does a new push
  its trainer dies mid-push           no chunk for push_timeout_s: discarded        WeightStore.expire
  committed                           the manifest against the chunks, every        WeightStore.commit
                                      tensor's CRC: visible at once, or refused     versions.Manifest.check_tensors
  a new trainer lineage commits       every version of the old lineage forgotten    WeightStore.publish
  stored                              the last keep_versions in memory; the         WeightStore.publish
                                      newest written to disk by a thread (a         WeightStore._persister
                                      safetensors file, renamed into place)         versions.write_file
  the param server restarts           the file's version served again (a corrupt    WeightStore._load_persisted
                                      file is ignored: it waits for a push)
  a worker asks for the newest        the manifest, and where to fetch it: its      RelayTree.sources
                                      relay ancestors nearest first, then the
                                      param server
  fetched                             chunks in order into one host buffer,         WeightFetcher.fetch
                                      FETCH_WINDOW in flight, each CRC-checked      versions.VersionBuffer.put
                                      where it lands
  a relay does not deliver in time    skipped for SHUN_S; the chunk is asked of     WeightFetcher.fetch
                                      the next source up
  relayed                             the chunks a worker holds, served to its      ChunkServer
                                      children; a missing one held until it lands
  complete and checked                offered to the worker's main thread           WeightFetcher.newest
  installed                           swapped in between batches (refused: the      inference_worker.Worker.pull
                                      worker keeps the one it has)                  inference_worker.Worker.install
  superseded                          its host memory holds a later version         WeightFetcher.retire
                                                                                    WeightFetcher.memory_for

DELTA VERSIONS (deltas.py). A worker that holds the full version before the newest fetches only what
changed; the version itself, its manifest and its CRCs are unchanged:

  encoded                             each pushed chunk against the same bytes of   WeightStore.receive_chunk
                                      the newest full version, on a thread pool,    deltas.Encoder
                                      as the push arrives: same, sparse, xor+zlib
                                      or full, the smallest
  a worker asks for the newest        the manifest and, if it holds the delta's     ParamServer._weights_reply
                                      base, the delta's manifest; a delta still     WeightStore.delta_pending
                                      encoding is waited for up to the push's time
  fetched                             the changed chunks' delta bytes, each         WeightFetcher.fetch
                                      rebuilt from the worker's own base and        WeightFetcher.rebuild
                                      checked against the full version's CRC
  refused                             a corrupt delta, a wrong base: the version    WeightFetcher.run
                                      fetched whole
  relayed                             a relay that got the delta serves its bytes   ChunkServer.answer

Through a shared directory instead (--weights-dir on the param server and the workers), the same
version takes these steps after it is stored:

  published                           written to a temporary name, fsynced,         weights_fs.DirTransport.publish
                                      renamed: a reader sees all of it or none;
                                      the oldest pruned, the newest keep kept
  read                                the newest file of at least n, every byte     weights_fs.DirTransport.newest
                                      CRC-checked; a torn or corrupt one is         versions.read_file
                                      refused by name and never offered

ADAPTER VERSIONS (LoRA). A LoRA trainer pushes its base once per lineage as a full version; every
later version is the adapter alone (lora.adapter_tensors), its manifest naming `base`, the full
version it applies to, and `lora`, the config (versions.Manifest). The same chunks, CRCs and rules
carry it; what differs:

  pushed                              push_weights(..., base=, lora=)               push_weights
  committed                           refused unless its base is the one pinned     WeightStore.check_base
  stored                              the lineage's base pinned whatever keep       WeightStore.publish
                                      says; a new lineage replaces it               WeightStore.held
  persisted                           the base and the newest adapter, two files    WeightStore._persister
  a worker asks for the newest        the adapter's manifest and its base's         wire.WeightManifest
  fetched                             the base first if not held (a new or          WeightFetcher.base_for
                                      restarted worker, a relay child), then the
                                      adapter; a relay keeps the base's bytes
  in a shared directory               the base kept while an adapter needs it       weights_fs.DirTransport.prune
  installed                           lora.merge(base on the device, adapter)       inference_worker.Worker.policy_params
"""
from __future__ import annotations

from versions import Version, VersionBuffer


class Transport:
    """How versions get from where they are made to the workers that sample with them: two calls.

    `publish(version)` makes a complete, checked version available; `newest(n, lineage, wait_s)`
    hands a reader the newest complete, checked version of at least n (or of a lineage other than
    `lineage`: a new trainer's versions start again from 0) that it has not had yet, waiting up to
    wait_s for one, else None. An adapter version comes with its base (VersionBuffer.base). The
    reader calls `done(version)` once it has installed or refused it: the transport may reuse its
    memory. A process uses the side it needs: the param server publishes, a worker reads; a
    transport may do both (weights_fs.DirTransport)."""

    def publish(self, version: Version) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not publish versions")

    def newest(self, min_version: int, lineage: str, wait_s: float) -> VersionBuffer | None:
        raise NotImplementedError(f"{type(self).__name__} does not read versions")

    def done(self, version: VersionBuffer) -> None:
        """The reader has installed `version` (or refused it): never offer it again."""
