package store

// A fencing token is epoch<<tokenEpochShift plus the counter's offset in
// its epoch (migrations 3 and 9). Both are bounded so that a token stays a
// positive bigint; next_token() refuses beyond them (ErrTokensExhausted).
const (
	tokenEpochShift = 40
	// MaxTokenOffset is the largest counter offset within one epoch.
	MaxTokenOffset = 1<<tokenEpochShift - 1
	// MaxTokenEpoch is the largest epoch.
	MaxTokenEpoch = 1<<23 - 1
)

// TokenEpoch splits a fencing token into the epoch it was drawn in and the
// counter's offset in that epoch.
func TokenEpoch(token int64) (epoch, offset int64) {
	return token >> tokenEpochShift, token & MaxTokenOffset
}

// Token is the fencing token at offset in epoch: TokenEpoch's inverse.
func Token(epoch, offset int64) int64 { return epoch<<tokenEpochShift + offset }
