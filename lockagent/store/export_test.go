package store

// GetWindowTakeableSQL lets the ownership table check that the re-read a
// refused claim falls back on answers as the claim does.
var GetWindowTakeableSQL = qGetWindowTakeable
