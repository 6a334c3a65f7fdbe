"""The model's weights in memory: read-only, checksummed, and shared between processes.

`cpu` moves the CPU weights into sealed read-only memory and checksums the
rest; `mapped` exports them from the host and binds them into another
process's module tree (the mapped design); `cuda_handles` is its device
half, memory that crosses processes by descriptor.

May import: nothing else of execution/ (it is the innermost room).
"""
