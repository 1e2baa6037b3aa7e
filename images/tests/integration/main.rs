//! The image builder's integration tests, one binary (each test binary links the crate graph
//! again): `disks` builds and boots the test disks, `secure_boot` the signed UEFI path's
//! pieces. Run one with `cargo test -p k3os-images --test integration disks::`.

mod disks;
mod secure_boot;
