// Package docs checks the repository's documents as a reader meets them:
// the README stays short enough to read in five minutes and sends the rest to
// docs/, every relative link in the README, docs/ and the other top-level
// documents leads to a file (and heading) that exists, and the files a
// release ships beside the code (LICENSE, CHANGELOG.md, SECURITY.md) are
// there and say what they must.
package docs
