"""Tables of kernel-lanes.sh logs: medians per row, and medians (ranges) of per-round ratios."""
import re
import statistics as st
import sys

sizes=[16,64,256,1024,2048,4096,8192,16384]
data={}
for f in sys.argv[1:]:
    txt=open(f).read()
    rounds=re.split(r'=== round (\d) afalg',txt)[1:]
    for i in range(0,len(rounds),2):
        body=rounds[i+1]
        afalg=[float(x) for x in re.findall(r'AES-128-CBC\s+([\d.]+)k',body)][:8]
        ts={}
        for m in re.finditer(r'chunks of (\d+) bytes: done\. [\d.]+ MB in [\d.]+ secs: ([\d.]+) MB/sec',body):
            ts[int(m.group(1))]=float(m.group(2))*1000
        rows={'afalg':afalg,'ts':[ts.get(s) for s in sizes]}
        for m in re.finditer(r'=== round \d ((?:old-)?(?:kernel|devcrypto)) lanes (\w+)\n\S+\s+(.*)',body):
            # openssl's format: values over 10000 B/s in thousands with a k, others in B/s.
            rows[f'{m.group(1)}{m.group(2)}']=[float(x) if k else float(x)/1e3 for x,k in re.findall(r'([\d.]+)(k?)',m.group(3))]
        for k,v in rows.items(): data.setdefault(k,[]).append(v)
n=len(data['afalg'])
print(f'rounds: {n}')
def med(k,j):
    vals=[row[j] for row in data[k] if row[j] is not None]
    return st.median(vals) if vals else None
print('| row | '+' | '.join(f'{s} B' if s<1024 else f'{s//1024} KiB' for s in sizes)+' |')
print('|---|'+'---:|'*8)
names={'afalg':'`openssl speed -engine afalg`','ts':"cryptodev `tests/speed`",'kernel1':'`kernel`, 1 lane','kernel2':'`kernel`, 2 lanes','devcrypto1':'`devcrypto`, 1 lane','devcrypto2':'`devcrypto`, 2 lanes'}
names.update({f'old-{e}{l}':f'{names[e+l]} (OLD)' for e in ['kernel','devcrypto'] for l in ['1','2']})
names.update({'kerneldefault':'`kernel`, default lanes','devcryptodefault':'`devcrypto`, default lanes'})
rows=[k for k in ['afalg','ts','kernel1','kernel2','kerneldefault','devcrypto1','devcrypto2','devcryptodefault','old-kernel1','old-devcrypto1','old-kernel2','old-devcrypto2'] if k in data]
for k in rows:
    print(f'| {names[k]} | '+' | '.join(f'{med(k,j):,.0f}' if med(k,j) else '–' for j in range(8))+' |')
print()
print('| ratio (median of per-round ratios, range) | '+' | '.join(f'{s} B' if s<1024 else f'{s//1024} KiB' for s in sizes)+' |')
print('|---|'+'---:|'*8)
def ratio(a,b):
    out=[]
    for j in range(8):
        rs=[ra[j]/rb[j] for ra,rb in zip(data[a],data[b]) if ra[j] and rb[j]]
        out.append(f'{st.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})' if rs else '–')
    return out
pairs=[('kernel1','afalg'),('kernel2','afalg'),('devcrypto1','kernel1'),('devcrypto2','kernel2'),('devcrypto1','ts'),('devcrypto2','ts')]
pairs+=[('kerneldefault','afalg'),('devcryptodefault','kerneldefault'),('devcryptodefault','ts')]
# The store's lane choice against one lane, per engine.
pairs+=[('kerneldefault','kernel1'),('devcryptodefault','devcrypto1')]
# With OLD_LANES: each old row against the afalg engine / tests/speed, and new against old.
pairs+=[('old-kernel1','afalg'),('old-devcrypto1','ts'),('kernel1','old-kernel1'),('devcrypto1','old-devcrypto1')]
pairs+=[('old-kernel2','afalg'),('old-devcrypto2','ts'),('kernel2','old-kernel2'),('devcrypto2','old-devcrypto2')]
for a,b in [p for p in pairs if p[0] in data and p[1] in data]:
    print(f'| {names[a]} / {names[b]} | '+' | '.join(ratio(a,b))+' |')
