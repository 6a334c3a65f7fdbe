"""Reading a request payload without letting it run anything on the way in.

`unpickler` is the restricted unpickler; `allowlist` says what a payload may
name and call; `reconstructors` are checked stand-ins for what nnsight's
payloads call; `legacy` adds what nnsight 0.6 and 0.7's format needs;
`images` reads PIL images as pixels; `shipped_classes` rebuilds classes a
request ships by value; `python_versions` reads payloads of other client
Pythons; `state` is the part of a load the reconstructors may use.

May import: the shared vocabulary and `python_layer`.
"""
