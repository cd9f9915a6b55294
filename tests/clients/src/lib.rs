//! Nothing to build: the tests (`tests/clients.rs`) run `cuda_client.py`, a program that uses
//! NVIDIA's Python bindings as users do, on simgpu with and without cuslice.
