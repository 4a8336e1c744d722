"""This host as the transport sees it: /proc primitives, the one mount-table parser, the shm
namespace id, identity, capacity, page size, who holds a file, and whether a pid can be trusted."""
