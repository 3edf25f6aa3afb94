"""FlashPass (Zeng's thesis, ch. 4; seeds/001_ba9f733b0dd4fda7.txt) as a lab prototype.

A proactive, sender-driven transport for shallow-buffered WANs, over UDP between the lab's
network namespaces. On a flow's arrival at T the sender sends small emulation packets at the
emulation rate; the switch puts them in a rate-limited emulation class (98/(98+1514) of the
link in frame bytes, 8 packets of buffer, single-threshold ECN/selective drop at 2 packets)
beside the data class; the receiver answers each emulation packet that survives with a
credit carrying its emulation timestamp; the sender sends one data packet per credit at
exactly that timestamp + T_wait, so the data arrives at the bottleneck spaced as the
emulation was, and the data queue stays nearly empty. Algorithm 2 adjusts each flow's
emulation rate per RTT (MIMD on the emulation loss, between the target loss bounds).
docs/flashpass.md says what is simplified.

wire      the packets (emulation, credit, data, probe, nack, done)
control   Algorithm 2 (per-RTT emulation-rate control), pure
theta     the tunable parameters (θ) as the agent writes them to the config file
switch    the emulated switch as real qdiscs: HTB classes, RED on the emulation class
sender    the sender (one flow), receiver: the receiver (any number of flows)
lab       the lab run in the guest: namespaces, switch, receiver, senders, their logs
"""
