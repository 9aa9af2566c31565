package image

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// Tree lists a host directory as entries: root becomes the image's /, and
// every directory, regular file and symbolic link below it an entry with its
// permission bits (links keep their target as written). Anything else (a
// device, a socket) is an error: an image built here never needs one.
func Tree(root string) ([]Entry, error) {
	var entries []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		imgPath := path.Join("/", filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			entries = append(entries, Entry{Path: imgPath, Mode: fs.ModeDir | mode.Perm()})
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			entries = append(entries, Symlink(imgPath, target))
		case mode.IsRegular():
			entries = append(entries, Entry{Path: imgPath, Mode: mode.Perm(), Source: p})
		default:
			return fmt.Errorf("%s: %v is neither a directory, a regular file nor a link", p, mode.Type())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("image tree %s: %w", root, err)
	}
	return entries, nil
}
