//! Nothing here: this package exists for its benchmark, `benches/peers.rs`,
//! which compares `scopetree` with candle's `VarMap` + `VarBuilder` and the
//! Paddle-style baseline in one run. See `docs/benchmarks.md`.
