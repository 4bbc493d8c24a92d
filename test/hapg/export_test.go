package hapg

// WithConn runs f on a fresh connection to a DSN, within a timeout for both:
// withConn, for the tests of package hapg_test.
var WithConn = withConn
