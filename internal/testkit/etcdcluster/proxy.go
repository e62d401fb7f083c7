package etcdcluster

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// proxyMode is what a proxy does with traffic.
type proxyMode int

const (
	// modePass forwards both directions.
	modePass proxyMode = iota
	// modeBlackhole accepts connections and forwards nothing; bytes wait
	// (in the proxy and the kernel buffers) until healed.
	modeBlackhole
	// modeHoldReplies forwards requests to the member but holds its replies.
	modeHoldReplies
	// modeDrop closes every connection and refuses new ones.
	modeDrop
)

func (m proxyMode) String() string {
	switch m {
	case modePass:
		return "pass"
	case modeBlackhole:
		return "blackhole"
	case modeHoldReplies:
		return "hold-replies"
	case modeDrop:
		return "drop"
	}
	return fmt.Sprintf("proxyMode(%d)", int(m))
}

// dialTimeout bounds a proxy's dial to its member.
const dialTimeout = 2 * time.Second

// proxy is a loopback TCP proxy in front of one member's client port. Its
// address stays the same for its whole life, across member restarts and
// drops.
type proxy struct {
	addr   string // listen address, host:port
	target string // member client address, host:port

	mu     sync.Mutex
	cond   *sync.Cond // signalled on every mode change and on close
	mode   proxyMode
	closed bool
	ln     net.Listener        // nil while dropped
	conns  map[net.Conn]func() // open client conns → close both ends
	wg     sync.WaitGroup      // accept loops and connection goroutines
}

// newProxy listens on a free loopback port and forwards to target.
func newProxy(target string) (*proxy, error) {
	// The port comes from below the ephemeral range, like a member's: the
	// listener is closed while the proxy drops, and an outgoing connection
	// could otherwise take the port before the heal listens on it again.
	ln, err := listenFree(nil)
	if err != nil {
		return nil, err
	}
	p := &proxy{addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]func(){}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop(ln)
	return p, nil
}

// setMode switches the proxy to m. Leaving modeDrop listens again on the same
// address.
func (p *proxy) setMode(m proxyMode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy closed")
	}
	p.mode = m
	p.cond.Broadcast()
	if m == modeDrop {
		if p.ln != nil {
			_ = p.ln.Close()
			p.ln = nil
		}
		for c, closeBoth := range p.conns {
			closeBoth()
			delete(p.conns, c)
		}
		return nil
	}
	if p.ln == nil {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("proxy listen again on %s: %w", p.addr, err)
		}
		p.ln = ln
		p.wg.Add(1)
		go p.acceptLoop(ln)
	}
	return nil
}

// close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c, closeBoth := range p.conns {
		closeBoth()
		delete(p.conns, c)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) acceptLoop(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // listener closed (drop or close)
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve handles one client connection: it waits while blackholed, dials the
// member, then copies both directions through the gates.
func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	var (
		once    sync.Once
		backend net.Conn
		bmu     sync.Mutex
	)
	closeBoth := func() {
		once.Do(func() {
			_ = client.Close()
			bmu.Lock()
			if backend != nil {
				_ = backend.Close()
			}
			bmu.Unlock()
		})
	}
	p.mu.Lock()
	if p.closed || p.mode == modeDrop {
		p.mu.Unlock()
		_ = client.Close()
		return
	}
	p.conns[client] = closeBoth
	for p.mode == modeBlackhole && !p.closed {
		p.cond.Wait()
	}
	live := !p.closed && p.mode != modeDrop
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, client)
		p.mu.Unlock()
		closeBoth()
	}()
	if !live {
		return
	}

	b, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		return // member down: the client sees its connection closed
	}
	bmu.Lock()
	backend = b
	bmu.Unlock()
	// A drop or close between the dial and here must not leave b open.
	p.mu.Lock()
	_, registered := p.conns[client]
	p.mu.Unlock()
	if !registered {
		return
	}

	done := make(chan struct{}, 2)
	go func() { p.pipe(b, client, true); closeBoth(); done <- struct{}{} }()
	go func() { p.pipe(client, b, false); closeBoth(); done <- struct{}{} }()
	<-done
	<-done
}

// pipe copies src to dst; request says the direction is client → member.
// Each chunk waits at the gate for a mode that lets it through.
func (p *proxy) pipe(dst, src net.Conn, request bool) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(request) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate blocks while the mode holds this direction and reports whether the
// bytes may be forwarded (false: drop or close).
func (p *proxy) gate(request bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.closed {
		switch p.mode {
		case modePass:
			return true
		case modeHoldReplies:
			if request {
				return true
			}
		case modeDrop:
			return false
		}
		p.cond.Wait()
	}
	return false
}
