"""phyfarm's pytest plugin: guests with an emulated AX88772A, and the farm's checks' tools."""
