//! The training process of one rank.
