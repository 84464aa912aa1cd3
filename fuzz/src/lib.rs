//! What the fuzz targets share: the invariants an accepted object must hold, stated independently of the
//! validation code they check (`check_object`).
pub mod canonical;
pub mod cluster;
pub mod invariants;
pub mod sequence;
pub mod steps;
pub mod tc;

pub use canonical::canonical;
pub use invariants::check_object;
