// Command dislock-image builds dislock's published images from the recipe in
// internal/image, without a container daemon:
//
//	dislock-image build  [flags] -o DIR     each image as DIR/<binary>.tar (docker-archive:
//	                                         ctr images import, docker load, crane push)
//	dislock-image rootfs [flags] -target T DIR   image T's root filesystem in DIR (the Dockerfile's
//	                                         build stage; its FROM scratch stage copies DIR)
//
// It lives under internal/ so the Dockerfile's build context (.dockerignore)
// holds it with the code it builds.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dislock/dislock/internal/image"
)

const usage = "usage: dislock-image build [flags] -o DIR | rootfs [flags] -target webhook|agent DIR"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	if len(args) == 0 || (args[0] != "build" && args[0] != "rootfs") {
		fmt.Fprintln(os.Stderr, usage)
		return 64
	}
	fs := flag.NewFlagSet("dislock-image "+args[0], flag.ContinueOnError)
	var b image.Build
	fs.StringVar(&b.Version, "version", image.DefaultVersion, "version stamped into the binaries and the "+image.LabelVersion+" label")
	fs.StringVar(&b.Commit, "commit", image.DefaultCommit, "commit stamped into the binaries and the "+image.LabelRevision+" label")
	fs.StringVar(&b.OS, "os", image.DefaultOS, "target OS")
	fs.StringVar(&b.Arch, "arch", "", "target architecture: amd64 or arm64 (default this machine's)")
	fs.StringVar(&b.CACerts, "ca-certificates", image.CACertsPath, "CA bundle to copy to "+image.CACertsPath)
	out := fs.String("o", "bin/images", "build: directory for the tarballs and the binaries")
	tags := map[string]*string{
		image.Webhook.Target: fs.String("webhook-tag", "ghcr.io/dislock/dislock:dev", "build: the webhook image's tag"),
		image.Agent.Target:   fs.String("agent-tag", "ghcr.io/dislock/dislock-agent:dev", "build: the agent image's tag"),
	}
	target := fs.String("target", "", "rootfs: the image (webhook or agent)")
	if err := fs.Parse(args[1:]); err != nil {
		return 64
	}
	b = b.WithDefaults()
	if err := b.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "dislock-image: %v\n", err)
		return 64
	}
	var err error
	if args[0] == "build" {
		err = build(ctx, b, *out, tags)
	} else {
		err = rootfs(ctx, b, *target, fs.Args())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dislock-image: %v\n", err)
		return 1
	}
	return 0
}

// build writes every image to its own tarball, so that each can be pushed
// alone (`crane push DIR/dislock-agent.tar REF`).
func build(ctx context.Context, b image.Build, out string, tags map[string]*string) error {
	for _, im := range image.All() {
		tag, err := name.NewTag(*tags[im.Target])
		if err != nil {
			return fmt.Errorf("-%s-tag %q: %w (want e.g. ghcr.io/dislock/%s:v1.2.0)", im.Target, *tags[im.Target], err, im.Binary)
		}
		img, _, err := b.Make(ctx, im, filepath.Join(out, b.OS+"-"+b.Arch))
		if err != nil {
			return err
		}
		file := filepath.Join(out, im.Binary+".tar")
		if err := tarball.WriteToFile(file, tag, img); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s\t%s\n", file, tag, digest)
	}
	return nil
}

// rootfs lays out one image's root filesystem in a new directory.
func rootfs(ctx context.Context, b image.Build, target string, args []string) error {
	im, err := image.ByTarget(target)
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	if len(args) != 1 {
		return fmt.Errorf("rootfs takes one directory, got %q", args)
	}
	dir, err := filepath.Abs(args[0])
	if err != nil {
		return err
	}
	// The binary is built outside dir: only the image's files go in.
	tmp, err := os.MkdirTemp("", "dislock-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	binary := filepath.Join(tmp, im.Binary)
	if err := b.Compile(ctx, im.Package, binary); err != nil {
		return err
	}
	return b.Rootfs(im, binary, dir)
}
