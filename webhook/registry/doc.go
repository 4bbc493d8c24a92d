// Package registry reads, from an image's registry, the entrypoint the
// injection wraps for an app container that has no command and no
// dislock.io/entrypoint annotation ([Resolver]). It runs per admission, on
// every replica, inside the review's deadline: with the pod's own pull
// secrets as its credentials ([PullSecretKeychain]), only where the
// destination policy lets it go (the --registry-* flags, [Options]), reading
// at most what the size bounds allow, and holding at most a namespace's share
// of the lookup slots. The tenant names the registry in its image, so each of
// these bounds is a bound on what a tenant can make the webhook do.
package registry
