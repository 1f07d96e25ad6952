#!/usr/bin/env python3
"""One Trio-ML worker over UDP, Python standard library only.

Sends a vector of 32-bit integers to `pfemu serve` and prints a verdict on the sums it gets
back: every worker of the job sends the same vector (value i - count/2 at index i), so a
Result of src_cnt sources must hold src_cnt times each value. `--verbose` prints the sums too.

    pfemu serve --listen 127.0.0.1:12000 --job 1:1 &
    python3 examples/trio_ml_client.py --server 127.0.0.1:12000 --job 1 --src 0 --count 3000

Each datagram is the 12-byte Trio-ML header (Figure 8 of the Trio paper) followed by the
gradients, big-endian:

    byte 0      job_id
    bytes 1-4   block_id
    byte 5      age_op (4 bits) | final (1) | degraded (1) | ctl (1) | 1 unused bit
    byte 6      src_id
    byte 7      src_cnt (0 in a worker's packet; the sources summed in a Result)
    bytes 8-9   gen_id
    bytes 10-11 run_id (4 bits) | grad_cnt (12 bits)

`ctl` and `run_id` are pfemu's run protocol, in the paper's padding (README, "Runs"): before
its gradients the worker sends a Join (ctl 1, age_op 1, block_id a random nonce, no
gradients) until the aggregator answers Joined (age_op 2, the nonce, the job's run id); then
every packet carries the run id, and Results of another run are ignored. So a restarted job
never takes the sums kept from its last run. An answer Superseded (age_op 3) means another
worker of the job started a new run: this one stops. Naming run 0, it means the aggregator
has no run for this worker's address: the worker's address changed (a NAT rebinding), or
the aggregator restarted since the worker joined it. The worker then joins again with the
same nonce and a Join naming its run (a rejoin), which `pfemu serve` takes from the process
that joined alone: answered Joined with the same run, it goes on; refused (Superseded, run 0,
the nonce in block_id), or answered with another run, it stops. `--no-join` speaks the
paper's header alone (fine for a job's single run).

Chunk c of the vector goes out as block c % window, generation c // window; the next chunk of
a block waits for that block's Result. A chunk without a Result in --retransmit-ms is sent
again (the aggregator answers a repeated chunk with the kept Result).
"""

import argparse
import os
import socket
import struct
import sys
import time

HDR = struct.Struct("!BIBBBHH")


CTL = 0x02
JOIN, JOINED, SUPERSEDED = 1, 2, 3


def header(job, block, final, src, gen, count, run=0):
    return HDR.pack(job, block, 0x08 if final else 0, src, 0, gen, run << 12 | count & 0x0FFF)


def join(sock, job, src, give_up_s, nonce=None, rejoin=0):
    """Joins the job's run, or with `nonce` and `rejoin` (its run) joins that run again from
    a new address; returns the run id and the nonce (run None if the server never answers,
    0 if it refused the rejoin)."""
    if nonce is None:
        nonce = int.from_bytes(os.urandom(4), "big")
    request = HDR.pack(job, nonce, JOIN << 4 | CTL, src, 0, 0, rejoin << 12)
    sent = None
    start = time.monotonic()
    while time.monotonic() - start < give_up_s:
        if sent is None or time.monotonic() - sent > 0.1:
            sock.send(request)
            sent = time.monotonic()
        try:
            data = sock.recv(65536)
        except (socket.timeout, ConnectionRefusedError):
            continue
        if len(data) != HDR.size:
            continue
        j, n, flags, s, _cnt, _gen, word = HDR.unpack(data)
        if (j, n, s, flags & CTL, flags >> 4) == (job, nonce, src, CTL, JOINED):
            return word >> 12, nonce
        refused = (job, nonce, src, CTL, SUPERSEDED, 0)
        if rejoin and (j, n, s, flags & CTL, flags >> 4, word >> 12) == refused:
            return 0, nonce
    return None, nonce


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default="127.0.0.1:12000")
    ap.add_argument("--job", type=int, default=1)
    ap.add_argument("--src", type=int, default=0)
    ap.add_argument("--count", type=int, default=3000, help="gradients (values i - count/2)")
    ap.add_argument("--per-packet", type=int, default=256)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--retransmit-ms", type=float, default=100.0)
    ap.add_argument("--give-up-s", type=float, default=10.0)
    ap.add_argument("--no-join", action="store_true", help="speak the paper's header alone")
    ap.add_argument("--verbose", action="store_true", help="print every sum too")
    a = ap.parse_args()
    if a.count < 1 or not 1 <= a.per_packet <= 4095:
        ap.error("--count must be at least 1 and --per-packet in 1..4095")

    host, port = a.server.rsplit(":", 1)
    values = [i - a.count // 2 for i in range(a.count)]
    g = a.per_packet
    chunks = [values[i : i + g] for i in range(0, len(values), g)]
    sums = [None] * len(chunks)
    src_cnt = [0] * len(chunks)

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((host, int(port)))
    sock.settimeout(0.01)
    run, nonce = 0, None
    if not a.no_join:
        run, nonce = join(sock, a.job, a.src, a.give_up_s)
        if run is None:
            print("gave up: no answer to the Join from %s" % a.server, file=sys.stderr)
            return 1

    def packet(c):
        block, gen = c % a.window, (c // a.window) & 0xFFFF
        hdr = header(a.job, block, c + 1 == len(chunks), a.src, gen, len(chunks[c]), run)
        return hdr + struct.pack("!%di" % len(chunks[c]), *chunks[c])

    slots = {}  # block id -> (chunk, last send time)
    next_chunk, done = 0, 0
    last_progress = time.monotonic()
    while done < len(chunks):
        now = time.monotonic()
        while next_chunk < len(chunks) and (next_chunk % a.window) not in slots:
            sock.send(packet(next_chunk))
            slots[next_chunk % a.window] = (next_chunk, now)
            next_chunk += 1
        for block, (c, sent) in list(slots.items()):
            if now - sent >= a.retransmit_ms / 1000.0:
                sock.send(packet(c))
                slots[block] = (c, now)
        try:
            data = sock.recv(65536)
        except (socket.timeout, ConnectionRefusedError):
            data = None
        if data and len(data) >= HDR.size:
            job, block, flags, _src, cnt, gen, word = HDR.unpack_from(data)
            gcnt, result_run = word & 0x0FFF, word >> 12
            if flags & CTL:
                if job == a.job and flags >> 4 == SUPERSEDED and run:
                    if result_run == 0 and block == 0:
                        # No run here for this address: join it again, with this nonce.
                        again, _ = join(sock, a.job, a.src, a.give_up_s, nonce, run)
                        if again == run:
                            continue
                        result_run = again or 0
                    if result_run == 0 and block == 0:
                        print("the aggregator has no run of job %d for this worker (it "
                              "restarted since the worker joined, or another process "
                              "joined as this source): this run stops" % job,
                              file=sys.stderr)
                    elif result_run == 0:
                        continue
                    else:
                        print("job %d moved on to run %d: this run stops" % (job, result_run),
                              file=sys.stderr)
                    return 1
                continue
            slot = slots.get(block)
            ours = result_run in (0, run)
            if job == a.job and ours and slot and len(data) == HDR.size + 4 * gcnt:
                c = slot[0]
                if gen == (c // a.window) & 0xFFFF and gcnt == len(chunks[c]):
                    sums[c] = list(struct.unpack_from("!%di" % gcnt, data, HDR.size))
                    src_cnt[c] = cnt
                    del slots[block]
                    done += 1
                    last_progress = time.monotonic()
        if time.monotonic() - last_progress > a.give_up_s:
            print("gave up: %d chunks without a result" % (len(chunks) - done), file=sys.stderr)
            return 1

    # Every worker sends the same vector, so each sum is src_cnt times the value sent.
    wrong = sum(
        1
        for c, chunk in enumerate(sums)
        for v, s in zip(chunks[c], chunk)
        if s != wrap32(src_cnt[c] * v)
    )
    print("src_cnt", min(src_cnt), max(src_cnt))
    if a.verbose:
        print("sums", " ".join(str(v) for chunk in sums for v in chunk))
    print(
        "verdict: %s: %d of %d sums are src_cnt x the values sent (%d chunks, src_cnt %d to %d)"
        % ("exact" if wrong == 0 else "NOT exact", a.count - wrong, a.count, len(chunks),
           min(src_cnt), max(src_cnt))
    )
    return 0 if wrong == 0 else 2


def wrap32(v):
    """v as the aggregator's 32-bit two's-complement sum holds it."""
    return (v + 2**31) % 2**32 - 2**31


if __name__ == "__main__":
    sys.exit(main())
